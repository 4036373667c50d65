"""Classification's plain models: `ImageClassifier` (logits [B, K]) and `LinearProbe` (logits of
every probe head [H, B, K]), and how each predicts from a checkpoint without its task
(`ClassifierInference`, `LinearProbeInference`: see `vitdense.models`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from vitdense.backbone import VisionTransformer
from vitdense.heads.linear_probe import probe_features
from vitdense.results.classification import ClassificationResult
from vitdense.types import ClassPrediction, ImageSizes, LabeledImages, Size


def top_k_prediction(logits: torch.Tensor, index: torch.Tensor, k: int = 5) -> ClassPrediction:
    """The `k` most probable classes of logits [B, K] (softmax in fp32), best first."""
    probs, classes = logits.float().softmax(-1).topk(min(k, logits.shape[-1]), dim=-1)
    return ClassPrediction(index, probs, classes)


class ImageClassifier(nn.Module):
    """backbone + classification head (e.g. `ClassificationHead`): images -> logits [B, K]."""

    def __init__(self, backbone: VisionTransformer, head: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, images: torch.Tensor, image_sizes: ImageSizes | None = None) -> torch.Tensor:
        """images [B, 3, H, W] (padded, with their `ImageSizes`) -> logits [B, K]."""
        return self.head(self.backbone(images, image_sizes))

    #: the names of `export_outputs`, in order (the graph's output names)
    export_names: ClassVar[tuple[str, ...]] = ("probs",)

    def export_outputs(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """What an exported graph returns for normalised images [B, 3, H, W]: probs [B, K]
        (softmax). Every model of this module declares its own (`vitdense.deploy.export`)."""
        return (self(images).softmax(-1),)


class LinearProbe(nn.Module):
    """A frozen backbone and linear heads on its class tokens (MAE's and DINOv2's probes).

    Args:
        backbone: the encoder; frozen and kept in evaluation mode here.
        heads: one or more heads from the probe features [B, F] to logits [B, K].
        n_last_blocks: class tokens of this many last blocks are concatenated (DINOv2: 4).
        avgpool: append the mean patch token of the last block (DINOv2's "avgpool").
    """

    def __init__(
        self, backbone: VisionTransformer, heads: nn.ModuleList, n_last_blocks: int = 1, avgpool: bool = False
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = heads
        self.n_last_blocks = n_last_blocks
        self.avgpool = avgpool
        backbone.freeze()
        backbone.eval()
        #: the head that validated best, the one that predicts; a buffer, so that checkpoints keep it
        self.register_buffer("best_head", torch.tensor(0), persistent=True)

    def train(self, mode: bool = True) -> LinearProbe:
        super().train(mode)
        self.backbone.eval()  # frozen means frozen: no dropout, no drop path
        return self

    @torch.no_grad()
    def extract(self, images: torch.Tensor, image_sizes: ImageSizes | None = None) -> torch.Tensor:
        """Probe input [B, F] from the frozen backbone."""
        return probe_features(self.backbone, images, image_sizes, self.n_last_blocks, self.avgpool)

    def classify(self, features: torch.Tensor) -> torch.Tensor:
        """[B, F] -> logits of every head [H, B, K]."""
        return torch.stack([head(features) for head in self.head])

    def forward(self, images: torch.Tensor, image_sizes: ImageSizes | None = None) -> torch.Tensor:
        """images [B, 3, H, W] -> logits of every head [H, B, K] (`best_head` picks one)."""
        return self.classify(self.extract(images, image_sizes))

    export_names: ClassVar[tuple[str, ...]] = ("probs",)

    def export_outputs(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """probs [B, K] of the head that validated best (`best_head`, picked by a tensor op:
        its value is data to torch.export, which cannot branch on it)."""
        return (self(images).index_select(0, self.best_head.view(1))[0].softmax(-1),)


@dataclass(frozen=True)
class ClassifierInference:
    """How `ClassificationTask` predicts, as plain data a checkpoint records (`vitdense.models`):
    its `ImageClassifier` built from the backbone and head factory, and the top-5 classes of
    each image."""

    num_classes: int

    result_type: ClassVar[type] = ClassificationResult

    def build(self, backbone: VisionTransformer, head: Callable[..., nn.Module]) -> ImageClassifier:
        return ImageClassifier(backbone, head(backbone.embed_dim, self.num_classes))

    def sample(self, image: torch.Tensor, size: Size, index: int) -> LabeledImages:
        return LabeledImages.unlabeled(image, size, index)

    def predict(self, model: ImageClassifier, batch: Any) -> ClassPrediction:
        return top_k_prediction(model(batch.image, batch.image_sizes), batch.index)


@dataclass(frozen=True)
class LinearProbeInference:
    """How `LinearProbeTask` predicts, as plain data: its `LinearProbe` (`heads` heads on the
    concatenated class tokens of `n_last_blocks` blocks, and their mean patch token with
    `avgpool`), and the top-5 classes of the head that validated best (`best_head`)."""

    num_classes: int
    heads: int = 1
    n_last_blocks: int = 1
    avgpool: bool = False

    result_type: ClassVar[type] = ClassificationResult

    def build(self, backbone: VisionTransformer, head: Callable[..., nn.Module]) -> LinearProbe:
        in_features = (self.n_last_blocks + int(self.avgpool)) * backbone.embed_dim
        heads = nn.ModuleList(head(in_features, self.num_classes) for _ in range(self.heads))
        return LinearProbe(backbone, heads, self.n_last_blocks, self.avgpool)

    def sample(self, image: torch.Tensor, size: Size, index: int) -> LabeledImages:
        return LabeledImages.unlabeled(image, size, index)

    def predict(self, model: LinearProbe, batch: Any) -> ClassPrediction:
        return top_k_prediction(model(batch.image, batch.image_sizes)[int(model.best_head)], batch.index)
