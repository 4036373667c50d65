"""A task written outside vitdense to README's contract, unlike README's example on every
point the contract covers: an image-level regression with its own head, its own plain model
(with its own export outputs), its own sample kind to predict on (`predict_sample`: the image
and its mirror image, for test-time flipping), a prediction without an `index` field, and a
result type that writes a file per image and a table. `tests/test_task_contract.py` runs it
through the real commands (`fit`, `predict`, `export`, `serve`) and compares every field with
`vitdense.load`.

The target is the synthetic images' class index, read as a number (an ordinal score).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, NamedTuple

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn
from torchmetrics import MeanAbsoluteError, MetricCollection

from vitdense.backbone import ViTFeatures
from vitdense.heads.classification import pool_tokens
from vitdense.results.common import Origin, ResultContext, WriteOptions
from vitdense.tasks import BackboneConfig, BaseTask
from vitdense.tasks.base import DEFAULT_BACKBONE, HeadFactory, Stage
from vitdense.training.optim import DEFAULT_LR_SCHEDULER, DEFAULT_OPTIMIZER
from vitdense.types import ImageSizes, LabeledImages, Losses
from vitdense.types.collate import pad_stack


class ScoreHead(nn.Module):
    """LayerNorm + two-layer MLP on the mean of the valid patch tokens -> one score per image."""

    def __init__(self, embed_dim: int, num_outputs: int = 1, hidden: int = 32) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.LayerNorm(embed_dim), nn.Linear(embed_dim, hidden), nn.GELU(), nn.Linear(hidden, 1))

    def forward(self, features: ViTFeatures) -> torch.Tensor:
        """-> scores [B]."""
        return self.mlp(pool_tokens(features, "avg"))[:, 0]


class ScoreRegressor(nn.Module):
    """Backbone + `ScoreHead`: normalised images [B, 3, H, W] -> scores [B]."""

    export_names: ClassVar[tuple[str, ...]] = ("score",)

    def __init__(self, backbone: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.backbone, self.head = backbone, head

    def forward(self, images: torch.Tensor, image_sizes: ImageSizes | None = None) -> torch.Tensor:
        return self.head(self.backbone(images, image_sizes))

    def export_outputs(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """score [B]: the mean over each image and its mirror image, as the task predicts."""
        return ((self(images) + self(images.flip(-1))) / 2,)


class FlipPair(NamedTuple):
    """The sample this task predicts on: an image and its mirror image (one, or a padded batch)."""

    image: torch.Tensor
    flipped: torch.Tensor
    index: torch.Tensor | int
    image_sizes: ImageSizes | None = None

    @classmethod
    def collate(cls, samples: list[FlipPair]) -> FlipPair:
        images, sizes = pad_stack([s.image for s in samples])
        flipped, _ = pad_stack([s.flipped for s in samples])
        return cls(images, flipped, torch.tensor([int(s.index) for s in samples]), sizes)


class Scored(NamedTuple):
    """predict_step's output for a batch: scores [B] (no index: the writer takes the batch's)."""

    scores: torch.Tensor


@dataclass(frozen=True)
class ImageScore(Origin):
    """One image's score and its size as given: scores/<name>.json and a line of scores.csv."""

    table_name: ClassVar[str | None] = "scores.csv"
    files_folder: ClassVar[str | None] = "scores"

    score: float
    height: int
    width: int

    @classmethod
    def from_prediction(cls, prediction: Scored, context: ResultContext) -> list[ImageScore]:
        pairs = zip(prediction.scores.tolist(), context.sizes, strict=True)
        return [cls(s, int(h), int(w), **context.origin(i)) for i, (s, (h, w)) in enumerate(pairs)]

    def to_dict(self) -> dict[str, Any]:
        return {"task": "score", "score": self.score, "size": [self.height, self.width], "source": self.source}

    def write(self, folder: Path, name: str, options: WriteOptions) -> None:
        path = folder / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict()))

    def rows(self) -> list[dict[str, Any]]:
        return [{"path": self.source or "", "score": repr(self.score), "height": self.height, "width": self.width}]

    @classmethod
    def write_table(cls, rows: list[dict[str, Any]], path: Path) -> None:
        with path.open("w", newline="") as file:
            writer = csv.DictWriter(file, ["path", "score", "height", "width"])
            writer.writeheader()
            writer.writerows(rows)


class ScoreTask(BaseTask):
    monitor: ClassVar[str] = "val/mae"
    mode: ClassVar[Literal["min", "max"]] = "min"
    result_type: ClassVar[type] = ImageScore

    def __init__(
        self,
        num_classes: int,
        head: HeadFactory = ScoreHead,
        class_names: list[str] | None = None,
        backbone: BackboneConfig = DEFAULT_BACKBONE,
        optimizer: OptimizerCallable = DEFAULT_OPTIMIZER,
        lr_scheduler: LRSchedulerCallable = DEFAULT_LR_SCHEDULER,
    ) -> None:
        super().__init__(
            num_classes=num_classes,
            head=head,
            class_names=class_names,
            backbone=backbone,
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
        )

    def configure_head(self, head: HeadFactory, backbone: nn.Module) -> nn.Module:
        return head(backbone.embed_dim, 1)

    def build_model(self, backbone: nn.Module, head: nn.Module) -> nn.Module:
        return ScoreRegressor(backbone, head)

    def configure_metrics(self) -> MetricCollection:
        return MetricCollection({"mae": MeanAbsoluteError()})

    def compute_loss(self, scores: torch.Tensor, batch: LabeledImages, stage: Stage) -> Losses:
        loss = F.smooth_l1_loss(scores, batch.label.float())
        return Losses(loss, {"loss_l1": loss})

    def update_metrics(self, metrics: MetricCollection, scores, batch: LabeledImages, stage: Stage) -> None:
        metrics.update(scores, batch.label.float())

    def predict_sample(self, image: torch.Tensor, size: tuple[int, int], index: int) -> FlipPair:
        return FlipPair(image, image.flip(-1), index)

    def predict_step(self, batch: FlipPair, batch_idx: int) -> Scored:
        # a mirror image pads on the same side as its image, so each keeps the batch's ImageSizes
        scores = (self.model(batch.image, batch.image_sizes) + self.model(batch.flipped, batch.image_sizes)) / 2
        return Scored(scores)
