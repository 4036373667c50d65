"""Image classification from the class token or from average-pooled patch tokens."""

from __future__ import annotations

from typing import Literal

import torch
from timm.layers import trunc_normal_
from torch import nn

from vitdense.backbone import ViTFeatures


def pool_tokens(features: ViTFeatures, pool: Literal["token", "avg"]) -> torch.Tensor:
    """[B, D] image representation: the class token, or the mean of the valid patch tokens."""
    if pool == "token":
        if features.cls_token is None:
            raise ValueError("pool='token' needs a backbone with a class token; use pool='avg'")
        return features.cls_token
    tokens = features.patch_tokens
    if not features.image_sizes.has_padding:
        return tokens.mean(dim=1)
    # padding tokens are zero: sum every token, divide by each image's own token count
    counts = torch.tensor([h * w for h, w in features.image_sizes.grids], device=tokens.device)
    return tokens.sum(1) / counts[:, None].to(tokens.dtype)


class ClassificationHead(nn.Module):
    """Dropout + linear classifier on a pooled representation (paper section 3.1 and 3.3).

    The classifier starts at zero when the backbone starts from pre-trained weights, as the
    paper does when fine-tuning ("we remove the pre-trained prediction head and attach a
    zero-initialized D x K layer"), and at timm's initialisation of a ViT trained from scratch
    otherwise: a zero head on a random backbone learns slower (issue 29: 73.4% instead of
    81.1% after 2 epochs from scratch). A task tells the head which case it is in through
    `init_for_backbone`; built alone, the head is in the from-scratch case.

    Args:
        embed_dim: D of the backbone.
        num_classes: K.
        pool: "token" (class token, the paper's default) or "avg" (global average pooling).
        drop_rate: dropout before the classifier.
        zero_init: None: follow the backbone (zero if it starts pre-trained, else timm's init);
            True / False: zero / timm's init whatever the backbone (checkpoints written before
            issue 29 record True and keep it).
    """

    def __init__(
        self,
        embed_dim: int,
        num_classes: int,
        pool: Literal["token", "avg"] = "token",
        drop_rate: float = 0.0,
        zero_init: bool | None = None,
    ) -> None:
        super().__init__()
        self.pool = pool
        self.zero_init = zero_init
        self.drop = nn.Dropout(drop_rate)
        self.fc = nn.Linear(embed_dim, num_classes)
        self._init_classifier(zero=bool(zero_init))

    def _init_classifier(self, zero: bool) -> None:
        if zero:
            nn.init.zeros_(self.fc.weight)
        else:
            # timm 1.0's VisionTransformer.init_weights (mode "", the default): its
            # init_weights_vit_timm gives every Linear, the head included, trunc_normal std .02
            trunc_normal_(self.fc.weight, std=0.02)
        nn.init.zeros_(self.fc.bias)

    def init_for_backbone(self, pretrained: bool) -> None:
        """Zero the classifier if the backbone starts from pre-trained weights (hub weights or a
        checkpoint file) and `zero_init` is None; an explicit `zero_init` already decided.
        Called by the task right after building the head (`BaseTask.configure_head`)."""
        if self.zero_init is None and pretrained:
            self._init_classifier(zero=True)

    def forward(self, features: ViTFeatures) -> torch.Tensor:
        """-> logits [B, K]."""
        return self.fc(self.drop(pool_tokens(features, self.pool)))
