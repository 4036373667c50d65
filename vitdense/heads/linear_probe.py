"""Linear-probe heads of MAE and DINOv2 on frozen ViT features."""

from __future__ import annotations

import torch
from torch import nn

from vitdense.backbone import VisionTransformer, ViTFeatures
from vitdense.heads.classification import pool_tokens
from vitdense.types import ImageSizes


def probe_features(
    backbone: VisionTransformer,
    images: torch.Tensor,
    image_sizes: ImageSizes | None,
    n_last_blocks: int,
    avgpool: bool,
) -> torch.Tensor:
    """[B, F] probe input: the class tokens of the last `n_last_blocks` blocks (each through
    the final norm, as DINOv2's `get_intermediate_layers(norm=True)`), concatenated, and
    with `avgpool` the mean valid patch token of the last block appended.

    F = (n_last_blocks + avgpool) * D. With n_last_blocks=1 and no avgpool this is the
    class token of MAE's linear probe.
    """
    blocks = tuple(range(-n_last_blocks, 0)) if n_last_blocks > 1 else ()
    f: ViTFeatures = backbone(images, image_sizes, intermediates=blocks)
    if f.cls_token is None:
        raise ValueError("the linear probe reads class tokens; this backbone has none")
    parts = [backbone.norm(x[:, 0]) for x in f.intermediates[:-1]] + [f.cls_token]
    if avgpool:
        parts.append(pool_tokens(f, "avg"))
    return torch.cat(parts, dim=-1)


class LinearProbeHead(nn.Module):
    """Linear classifier on frozen features, optionally behind a BatchNorm without affine
    parameters (MAE, appendix A.2: "a BatchNorm layer without affine transformation"
    normalises the features, which makes the probe far less sensitive to the learning rate).

    Args:
        in_features: F of `probe_features`.
        num_classes: K.
        batch_norm: put BatchNorm1d(affine=False) in front (MAE); DINOv2 has none.
    """

    def __init__(self, in_features: int, num_classes: int, batch_norm: bool = True) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(in_features, affine=False, eps=1e-6) if batch_norm else nn.Identity()
        self.fc = nn.Linear(in_features, num_classes)
        nn.init.trunc_normal_(self.fc.weight, std=0.01)  # MAE and DINOv2 both init at 0.01
        nn.init.zeros_(self.fc.bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """[B, F] -> logits [B, K]."""
        return self.fc(self.norm(features))
