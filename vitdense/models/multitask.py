"""Several plain models on one encoder, run with one pass of it (`vitdense.tasks.MultiTask`'s
model for inference and export).

    images [B, 3, H, W] (+ ImageSizes)
      MultiTaskModel({"det": DETRDetector, "seg": Segmenter, ...})
        -> {"det": DetectionOutput, "seg": logits [B, K, H, W], ...}

Every model holds the same encoder object; inside `forward` (and `export_outputs`) the
encoder runs once, computing the union of what the heads read (`VisionTransformer.one_pass`),
and each head gets exactly the features its own model would have asked for: each output is
the one its model gives alone, to the last bit in fp32.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from vitdense.backbone import VisionTransformer
from vitdense.backbone.one_pass import EncoderRequest, shared_request
from vitdense.core.errors import ConfigError
from vitdense.types import ImageSizes


class MultiTaskModel(nn.Module):
    """Plain models (`vitdense.models`) sharing one encoder, by name.

    Args:
        models: {name: model}, each with the encoder as `.backbone`: the first's is kept and
            given to the others (their weights must be the same encoder's: a multi-task
            checkpoint's, or heads trained on one frozen encoder).

    Export (`vitdense.deploy.export`): the graph returns each model's `export_outputs`, in
    model order, named "<name>.<output>" (e.g. "det.boxes", "seg.logits", "depth.depth").
    """

    def __init__(self, models: Mapping[str, nn.Module]) -> None:
        super().__init__()
        if not models:
            raise ConfigError("MultiTaskModel: give at least one model, e.g. {'seg': segmenter}")
        first = next(iter(models.values()))
        self.backbone: VisionTransformer = first.backbone
        for model in models.values():
            model.backbone = self.backbone
        self.models = nn.ModuleDict(dict(models))

    @property
    def encoder_request(self) -> EncoderRequest:
        return shared_request(self.models)

    def forward(self, images: torch.Tensor, image_sizes: ImageSizes | None = None) -> dict[str, Any]:
        """{name: that model's output} for images [B, 3, H, W], the encoder run once."""
        with self.backbone.one_pass(self.encoder_request):
            return {name: model(images, image_sizes) for name, model in self.models.items()}

    @property
    def export_names(self) -> tuple[str, ...]:
        return tuple(f"{name}.{out}" for name, model in self.models.items() for out in export_names_of(name, model))

    def export_outputs(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Every model's export outputs in model order (see `export_names`), one encoder pass."""
        with self.backbone.one_pass(self.encoder_request):
            return tuple(out for model in self.models.values() for out in model.export_outputs(images))


def export_names_of(name: str, model: nn.Module) -> tuple[str, ...]:
    names = getattr(model, "export_names", None)
    if not callable(getattr(model, "export_outputs", None)) or not names:
        raise ConfigError(
            f"task {name!r}: {type(model).__name__} declares no export_outputs(images) and export_names, so the "
            "multi-task graph cannot include it (see vitdense.models.ImageClassifier)"
        )
    return tuple(names)
