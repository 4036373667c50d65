"""Linear probing: a frozen ViT, linear classifiers on its features (MAE and DINOv2 recipes)."""

from __future__ import annotations

from functools import partial
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from vitdense.backbone import VisionTransformer
from vitdense.core.errors import ConfigError
from vitdense.heads import LinearProbeHead
from vitdense.models.classification import LinearProbe, LinearProbeInference, top_k_prediction
from vitdense.results.classification import ClassificationResult
from vitdense.tasks.base import DEFAULT_BACKBONE, BackboneConfig, BaseTask, HeadFactory, Stage
from vitdense.tasks.pictures import draw_classified
from vitdense.training.optim import DEFAULT_LR_SCHEDULER, DEFAULT_OPTIMIZER
from vitdense.types import ClassPrediction, ImageSizes, LabeledImages, Losses

#: MAE's probe: BatchNorm without affine, then a linear layer
DEFAULT_PROBE_HEAD = partial(LinearProbeHead, batch_norm=True)


class LinearProbeTask(BaseTask):
    """Train linear heads on a frozen backbone, several learning rates side by side.

    The backbone gets no gradients, is left out of the optimizer and stays in eval mode
    (its weights end bit-identical). One head per entry of `lrs` trains on the same
    features in the same pass; each logs `{stage}/acc1_lr{i}` (and its loss
    `{stage}/loss_lr{i}`), and `{stage}/acc1` is the best of them (`{stage}/best_lr_index`
    says which; the head that validated best makes the predictions).

    Args:
        num_classes: K (linked from the DataModule).
        head: `head(in_features, num_classes)`, called once per learning rate; default
            `LinearProbeHead` with MAE's BatchNorm (DINOv2: `init_args: {batch_norm: false}`).
        lrs: learning rate of each head; None: one head at the optimizer's rate.
        n_last_blocks: class tokens of this many last blocks are concatenated (DINOv2: 4).
        avgpool: append the mean patch token of the last block (DINOv2's "avgpool").
        cache_features: keep each sample's features after its first pass and skip the
            backbone afterwards. Needs samples with an `index` and deterministic train
            transforms (an augmented first view would be frozen into the cache).
        class_names: names of the K classes, for predictions (linked from the DataModule).
        backbone: built as configured, then frozen whatever `freeze` says.
    """

    result_type: ClassVar[type] = ClassificationResult
    monitor: ClassVar[str] = "val/acc1"
    mode: ClassVar[Literal["min", "max"]] = "max"

    def __init__(
        self,
        num_classes: int,
        head: HeadFactory = DEFAULT_PROBE_HEAD,
        lrs: list[float] | None = None,
        n_last_blocks: int = 1,
        avgpool: bool = False,
        cache_features: bool = False,
        class_names: list[str] | None = None,
        backbone: BackboneConfig = DEFAULT_BACKBONE,
        optimizer: OptimizerCallable = DEFAULT_OPTIMIZER,
        lr_scheduler: LRSchedulerCallable = DEFAULT_LR_SCHEDULER,
        lr_interval: Literal["step", "epoch"] = "step",
        compile: bool | dict[str, Any] = False,
    ) -> None:
        # read by the hooks the base calls
        self.lrs = list(lrs) if lrs else [None]
        self.n_last_blocks = n_last_blocks
        self.avgpool = avgpool
        super().__init__(
            num_classes=num_classes,
            head=head,
            class_names=class_names,
            backbone=backbone,
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            lr_interval=lr_interval,
            compile=compile,
        )
        self.cache_features = cache_features
        self._cache: dict[tuple[str, int], torch.Tensor] = {}

    def configure_backbone(self, config: BackboneConfig) -> VisionTransformer:
        """The backbone as configured (the model freezes it, whatever `freeze` says)."""
        backbone = super().configure_backbone(config)
        if not 1 <= self.n_last_blocks <= backbone.depth:
            raise ConfigError(f"n_last_blocks={self.n_last_blocks}: must be between 1 and the backbone's depth")
        return backbone

    def configure_head(self, head: HeadFactory, backbone: VisionTransformer) -> nn.ModuleList:
        """One head per learning rate, on the concatenated features."""
        in_features = (self.n_last_blocks + int(self.avgpool)) * backbone.embed_dim
        return nn.ModuleList(head(in_features, self.num_classes) for _ in self.lrs)

    def build_model(self, backbone: VisionTransformer, head: nn.Module) -> LinearProbe:
        return LinearProbe(backbone, head, self.n_last_blocks, self.avgpool)

    @property
    def best_head(self) -> torch.Tensor:
        """Index of the head that validated best (a buffer of the model: checkpoints keep it)."""
        return self.model.best_head

    def configure_metrics(self) -> MetricCollection:
        return MetricCollection(
            {
                f"acc1_lr{i}": MulticlassAccuracy(self.num_classes, top_k=1, average="micro")
                for i in range(len(self.lrs))
            }
        )

    def extract(self, images: torch.Tensor, image_sizes: ImageSizes | None = None) -> torch.Tensor:
        """Probe input [B, F] from the frozen backbone."""
        return self.model.extract(images, image_sizes)

    def classify(self, features: torch.Tensor) -> torch.Tensor:
        """[B, F] -> logits of every head [H, B, K]."""
        return self.model.classify(features)

    def forward_batch(self, batch: LabeledImages, stage: Stage) -> torch.Tensor:
        if not self.cache_features:
            return super().forward_batch(batch, stage)
        indices = batch.index.tolist()
        if min(indices) < 0:
            raise ConfigError("cache_features=True needs samples with an index (LabeledImages.index >= 0)")
        keys = [(stage, i) for i in indices]  # splits share indices; the stage names the split
        if all(k in self._cache for k in keys):
            features = torch.stack([self._cache[k] for k in keys]).to(self.device)
        else:
            features = self.extract(batch.image, batch.image_sizes)
            self._cache.update(zip(keys, features.cpu(), strict=True))
        return self.classify(features)

    def compute_loss(self, logits: torch.Tensor, batch: LabeledImages, stage: Stage) -> Losses:
        # each head's gradient depends only on its own term: one sum trains them independently
        terms = {f"loss_lr{i}": F.cross_entropy(head_logits, batch.label) for i, head_logits in enumerate(logits)}
        return Losses(sum(terms.values()), terms if len(terms) > 1 else {})

    def update_metrics(
        self, metrics: MetricCollection, logits: torch.Tensor, batch: LabeledImages, stage: Stage
    ) -> None:
        for i, head_logits in enumerate(logits):
            metrics[f"acc1_lr{i}"].update(head_logits, batch.label)

    def summarize(self, result: dict[str, Any], stage: Stage) -> dict[str, torch.Tensor]:
        """Validation picks the best head (`{stage}/acc1` is its accuracy); every other stage
        reports the head validation picked, never the best on its own split: choosing the
        rate on the split that is reported would flatter the probe (hold out part of the
        training set as validation and `test` on the benchmark's validation set)."""
        accs = torch.stack([result[f"{stage}/acc1_lr{i}"] for i in range(len(self.lrs))])
        if stage == "val":
            best = accs.argmax()
            if not self.trainer.sanity_checking:
                self.best_head.fill_(best)
        else:
            best = self.best_head.to(accs.device)
        return {
            **super().summarize(result, stage),
            f"{stage}/acc1": accs[best],
            f"{stage}/best_lr_index": best.float(),
        }

    def draw_batch(self, batch: LabeledImages, pixels: list[np.ndarray], palette: np.ndarray) -> list[np.ndarray]:
        """One grid: each image with its true class and the best head's prediction."""
        probs = self.forward_batch(batch, "val")[int(self.best_head)].softmax(-1)
        return [draw_classified(pixels, batch.label.tolist(), probs, self.class_names)]

    def predict_step(self, batch: LabeledImages | None, batch_idx: int) -> ClassPrediction | None:
        """Top-k of the head that validated best (the first before any validation)."""
        if batch is None:  # every image of the batch was unreadable and skipped (on_bad_sample=skip)
            return None
        return top_k_prediction(self.forward_batch(batch, "predict")[int(self.best_head)], batch.index)

    def plain_inference(self) -> LinearProbeInference:
        """`predict_step` without the task: the best head's top-5 classes (`vitdense.models`)."""
        return LinearProbeInference(self.num_classes, len(self.lrs), self.n_last_blocks, self.avgpool)

    def param_groups(self) -> list[dict]:
        return [
            {"params": list(head.parameters()), **({"lr": lr} if lr is not None else {})}
            for head, lr in zip(self.head, self.lrs, strict=True)
        ]
