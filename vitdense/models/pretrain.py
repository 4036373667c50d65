"""Pre-training's plain model: `MaskedImageModel` (a pre-training objective's predictions and
targets)."""

from __future__ import annotations

import torch
from torch import nn

from vitdense.backbone import VisionTransformer
from vitdense.types import ImageSizes


class MaskedImageModel(nn.Module):
    """backbone + a self-supervised objective (`vitdense.pretrain`): images -> the
    objective's predictions, targets and hidden patches (`MaskedImageOutput`).

    The objective is the model's `head` as far as training goes (optimised with it), but
    only the backbone is what pre-training is for: downstream tasks load `backbone.*`.
    """

    def __init__(self, backbone: VisionTransformer, objective: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.objective = objective

    @property
    def head(self) -> nn.Module:
        return self.objective

    def forward(
        self,
        images: torch.Tensor,
        image_sizes: ImageSizes | None = None,
        generator: torch.Generator | None = None,
    ):
        """images [B, 3, H, W] (padded, with their `ImageSizes`); `generator` draws the
        masks (None: torch's global generator)."""
        return self.objective(self.backbone, images, image_sizes, generator)
