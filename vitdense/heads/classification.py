"""Image classification from the class token or from average-pooled patch tokens."""

from __future__ import annotations

from typing import Literal

import torch
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

    Args:
        embed_dim: D of the backbone.
        num_classes: K.
        pool: "token" (class token, the paper's default) or "avg" (global average pooling).
        drop_rate: dropout before the classifier.
        zero_init: zero the classifier, as the paper does when fine-tuning ("we remove the
            pre-trained prediction head and attach a zero-initialized D x K layer").
    """

    def __init__(
        self,
        embed_dim: int,
        num_classes: int,
        pool: Literal["token", "avg"] = "token",
        drop_rate: float = 0.0,
        zero_init: bool = True,
    ) -> None:
        super().__init__()
        self.pool = pool
        self.drop = nn.Dropout(drop_rate)
        self.fc = nn.Linear(embed_dim, num_classes)
        if zero_init:
            nn.init.zeros_(self.fc.weight)
            nn.init.zeros_(self.fc.bias)

    def forward(self, features: ViTFeatures) -> torch.Tensor:
        """-> logits [B, K]."""
        return self.fc(self.drop(pool_tokens(features, self.pool)))
