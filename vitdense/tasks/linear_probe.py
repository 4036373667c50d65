"""Linear probing: a frozen ViT, linear classifiers on its features (MAE and DINOv2 recipes)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from vitdense.heads import LinearProbeHead, probe_features
from vitdense.optim import DEFAULT_LR_SCHEDULER, DEFAULT_OPTIMIZER
from vitdense.tasks.base import DEFAULT_BACKBONE, BackboneConfig, BaseTask, Stage
from vitdense.tasks.classification import ClassPrediction, top_k_prediction
from vitdense.types import LabeledImages


class LinearProbeTask(BaseTask):
    """Train linear heads on a frozen backbone, several learning rates side by side.

    The backbone gets no gradients, is left out of the optimizer and stays in eval mode
    (its weights end bit-identical). One head per entry of `lrs` trains on the same
    features in the same pass; each logs `{stage}/acc1_lr{i}`, and `{stage}/acc1` is the
    best of them (`{stage}/best_lr_index` says which).

    Args:
        num_classes: K (linked from the DataModule).
        lrs: learning rate of each head; None: one head at the optimizer's rate.
        n_last_blocks: class tokens of this many last blocks are concatenated (DINOv2: 4).
        avgpool: append the mean patch token of the last block (DINOv2's "avgpool").
        batch_norm: BatchNorm without affine in front of each classifier (MAE).
        cache_features: keep each sample's features after its first pass and skip the
            backbone afterwards. Needs samples with an `index` and deterministic train
            transforms (an augmented first view would be frozen into the cache).
        class_names: names of the K classes, for predictions (linked from the DataModule).
        backbone: built as configured, then frozen whatever `freeze` says.
    """

    monitor = "val/acc1"
    mode = "max"

    def __init__(
        self,
        num_classes: int,
        lrs: list[float] | None = None,
        n_last_blocks: int = 1,
        avgpool: bool = False,
        batch_norm: bool = True,
        cache_features: bool = False,
        class_names: list[str] | None = None,
        backbone: BackboneConfig = DEFAULT_BACKBONE,
        optimizer: OptimizerCallable = DEFAULT_OPTIMIZER,
        lr_scheduler: LRSchedulerCallable = DEFAULT_LR_SCHEDULER,
    ) -> None:
        if n_last_blocks < 1:
            raise ValueError(f"n_last_blocks={n_last_blocks}: must be at least 1")
        self.num_classes = num_classes
        self.lrs = list(lrs) if lrs else [None]
        self.n_last_blocks = n_last_blocks
        self.avgpool = avgpool
        self.batch_norm = batch_norm
        self.cache_features = cache_features
        self.class_names = class_names
        super().__init__(backbone, optimizer, lr_scheduler)
        if n_last_blocks > self.backbone.depth:
            raise ValueError(f"n_last_blocks={n_last_blocks} exceeds the backbone's {self.backbone.depth} blocks")
        self.backbone.freeze()
        self.backbone.eval()
        self._cache: dict[tuple[str, int], torch.Tensor] = {}
        # which head validated best; a buffer, so that it travels in checkpoints
        self.register_buffer("best_head", torch.tensor(0), persistent=True)

    def build_head(self) -> nn.Module:
        in_features = (self.n_last_blocks + int(self.avgpool)) * self.backbone.embed_dim
        return nn.ModuleList(LinearProbeHead(in_features, self.num_classes, self.batch_norm) for _ in self.lrs)

    def build_metrics(self) -> MetricCollection:
        return MetricCollection(
            {
                f"acc1_lr{i}": MulticlassAccuracy(self.num_classes, top_k=1, average="micro")
                for i in range(len(self.lrs))
            }
        )

    def train(self, mode: bool = True) -> LinearProbeTask:
        super().train(mode)
        self.backbone.eval()  # frozen means frozen: no dropout, no drop path
        return self

    @torch.no_grad()
    def extract(self, images: torch.Tensor, pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Probe input [B, F] from the frozen backbone."""
        return probe_features(self.backbone, images, pad_mask, self.n_last_blocks, self.avgpool)

    def forward(self, images: torch.Tensor, pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        """-> logits of every head [H, B, K]."""
        return self.classify(self.extract(images, pad_mask))

    def classify(self, features: torch.Tensor) -> torch.Tensor:
        return torch.stack([head(features) for head in self.head])

    def forward_batch(self, batch: LabeledImages) -> torch.Tensor:
        if not self.cache_features:
            return super().forward_batch(batch)
        indices = batch.index.tolist() if torch.is_tensor(batch.index) else [batch.index]
        if min(indices) < 0:
            raise ValueError("cache_features=True needs samples with an index (LabeledImages.index >= 0)")
        keys = [(self._cache_split(), i) for i in indices]  # splits share indices
        if all(k in self._cache for k in keys):
            features = torch.stack([self._cache[k] for k in keys]).to(self.device)
        else:
            features = self.extract(*self.batch_images(batch))
            self._cache.update(zip(keys, features.cpu(), strict=True))
        return self.classify(features)

    def _cache_split(self) -> str:
        """Which dataset a batch comes from: train, val (also during the sanity check), test, predict."""
        if self._trainer is None:
            return "train" if self.training else "eval"
        stage = self.trainer.state.stage
        return {"sanity_check": "validate"}.get(stage.value, stage.value) if stage is not None else "eval"

    def compute_loss(self, logits: torch.Tensor, batch: LabeledImages) -> torch.Tensor:
        # each head's gradient depends only on its own term: one sum trains them independently
        return sum(F.cross_entropy(head_logits, batch.label) for head_logits in logits)

    def update_metrics(self, metrics: MetricCollection, logits: torch.Tensor, batch: LabeledImages) -> None:
        for i, head_logits in enumerate(logits):
            metrics[f"acc1_lr{i}"].update(head_logits, batch.label)

    def _log_best(self, stage: Stage) -> None:
        metrics: MetricCollection = getattr(self, f"{stage}_metrics")
        accs = torch.stack([metrics[f"acc1_lr{i}"].compute() for i in range(len(self.lrs))])
        self.log(f"{stage}/acc1", accs.max(), prog_bar=True)
        self.log(f"{stage}/best_lr_index", accs.argmax().float())
        if stage == "val" and not self.trainer.sanity_checking:
            self.best_head.fill_(accs.argmax())

    def on_validation_epoch_end(self) -> None:
        self._log_best("val")

    def on_test_epoch_end(self) -> None:
        self._log_best("test")

    def predict_step(self, batch: LabeledImages, batch_idx: int) -> ClassPrediction:
        """Top-k of the head that validated best (the first before any validation)."""
        return top_k_prediction(self(*self.batch_images(batch))[int(self.best_head)], batch.index)

    def param_groups(self) -> list[dict]:
        return [
            {"params": list(head.parameters()), **({"lr": lr} if lr is not None else {})}
            for head, lr in zip(self.head, self.lrs, strict=True)
        ]
