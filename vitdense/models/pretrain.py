"""Pre-training's plain model: `MaskedImageModel` (a pre-training objective's predictions and
targets), and how a checkpoint rebuilds it without its task (`MaskedImageInference`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from vitdense.backbone import VisionTransformer
from vitdense.types import ImageSizes, LabeledImages, Size


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


@dataclass(frozen=True)
class MaskedImageInference:
    """How a `MaskedImageModelingTask` checkpoint is rebuilt without its task (`vitdense.models`):
    its `MaskedImageModel`, the objective built for the backbone (`objective(embed_dim,
    patch_size, in_chans)`). It predicts nothing (no `result_type`): what pre-training makes
    is the backbone (`vitdense.load_model`, `python -m vitdense export --format weights`)."""

    result_type: ClassVar[type | None] = None

    def build(self, backbone: VisionTransformer, head: Callable[..., nn.Module]) -> MaskedImageModel:
        return MaskedImageModel(backbone, head(backbone.embed_dim, backbone.patch_size, backbone.in_chans))

    def sample(self, image: torch.Tensor, size: Size, index: int) -> LabeledImages:
        return LabeledImages.unlabeled(image, size, index)

    def predict(self, model: MaskedImageModel, batch: Any) -> Any:
        raise TypeError(
            "a pre-training checkpoint predicts nothing (MaskedImageModelingTask names no result_type): use its "
            "backbone (vitdense.load_model(ckpt).backbone, or python -m vitdense export --format weights)"
        )
