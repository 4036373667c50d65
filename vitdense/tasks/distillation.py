"""Feature distillation as pre-training: a frozen teacher encoder taught to a student backbone
on images without labels (`vitdense.pretrain.distillation` has the objective and its references)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import nn

from vitdense.backbone import VisionTransformer
from vitdense.core.errors import ConfigError
from vitdense.pretrain.distillation import (
    DistillationOutput,
    FeatureDistillation,
    FeatureDistillationInference,
    FeatureDistillationModel,
    FrozenTeacher,
    ObjectiveFactory,
    TeacherFeatureCache,
    TeacherFeatures,
    view_fingerprint,
)
from vitdense.tasks.base import DEFAULT_BACKBONE, BackboneConfig, BaseTask, Stage, follow_grad_checkpointing
from vitdense.tasks.pretrain import record_objective
from vitdense.training.optim import DEFAULT_LR_SCHEDULER, DEFAULT_OPTIMIZER
from vitdense.types import ImageSizes, LabeledImages, Losses


class FeatureDistillationTask(BaseTask):
    """Pre-train the backbone (the student) by matching a frozen teacher's features: its patch
    tokens and its class token through learned projectors (`FeatureDistillation`: LightlyTrain's
    v2 patch objective and timm's `FeatureDistillationTask` on the class token). Logs
    `{stage}/loss`, `{stage}/loss_patch` and `{stage}/loss_cls`.

    The result is the student backbone: every task loads it with `backbone.checkpoint:
    path/to/last.ckpt` (checkpoints hold the student and the projectors, never the teacher).

    Args:
        teacher: the teacher encoder, as any backbone is configured (`BackboneConfig`): a timm
            name with a local weights file (`checkpoint`: timm, DINOv3, EVA-02, ... files, or a
            vitdense checkpoint, whose backbone is taken), or `pretrained: true` (online).
            Frozen, in eval mode, under no_grad, in bf16 only where the device computes it natively.
        objective: `objective(embed_dim, teacher_dim)`: `FeatureDistillation` (its `init_args`:
            teacher_blocks, patch_weight, cls_weight).
        teacher_cache: a folder for the teacher's features, one file per image file and teacher
            (`TeacherFeatureCache`): only for data read from image files whose views are the same
            every epoch (no random crop or flip; refused otherwise). None: no cache.
        teacher_precision: "auto": the teacher in bf16 autocast where the device computes bf16
            natively (`vitdense.core.precision`), else fp32; "32": always fp32.
        teacher_scale: the teacher sees the images resized by this factor (`FrozenTeacher.scale`):
            another image size than the student's; its grid is resampled to the student's either way.
        num_classes, class_names: unused (linked from a DataModule that has classes; their
            labels are never read).
        (the rest: see `BaseTask`)
    """

    monitor: ClassVar[str] = "val/loss"
    mode: ClassVar[Literal["min", "max"]] = "min"
    #: how the teacher is run, not what the student is: may differ at validate and test
    evaluation_settings: ClassVar[tuple[str, ...]] = (
        "compile",
        "teacher_cache",
        "teacher_precision",
    )  # (not teacher_scale: it changes what is taught)

    def __init__(
        self,
        teacher: BackboneConfig,
        objective: ObjectiveFactory = FeatureDistillation,
        teacher_cache: str | None = None,
        teacher_precision: Literal["auto", "32"] = "auto",
        teacher_scale: float = 1.0,
        num_classes: int | None = None,
        class_names: list[str] | None = None,
        backbone: BackboneConfig = DEFAULT_BACKBONE,
        optimizer: OptimizerCallable = DEFAULT_OPTIMIZER,
        lr_scheduler: LRSchedulerCallable = DEFAULT_LR_SCHEDULER,
        lr_interval: Literal["step", "epoch"] = "step",
        compile: bool | dict[str, Any] = False,
    ) -> None:
        if not isinstance(teacher, BackboneConfig):
            teacher = BackboneConfig(**dict(teacher))
        if not teacher.pretrained and teacher.checkpoint is None:
            rank_zero_warn(
                "model.init_args.teacher has neither checkpoint nor pretrained: the teacher has random weights, "
                "which teach nothing; give it a weights file (teacher.checkpoint)"
            )
        self.teacher_config = teacher
        self.teacher_cache = teacher_cache
        if teacher_precision not in ("auto", "32"):
            raise ConfigError(f"model.init_args.teacher_precision={teacher_precision!r}: 'auto' or '32'")
        self.teacher_precision = teacher_precision
        self.teacher_scale = teacher_scale
        self._cache: TeacherFeatureCache | None = None
        super().__init__(
            num_classes=0,
            head=objective,
            backbone=backbone,
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            lr_interval=lr_interval,
            compile=compile,
        )
        record_objective(self.hparams)

    @property
    def objective(self) -> FeatureDistillation:
        return self.model.objective

    @property
    def teacher(self) -> FrozenTeacher:
        return self.model.teacher

    def configure_head(self, head: ObjectiveFactory, backbone: VisionTransformer) -> nn.Module:
        """The objective's projectors for the student `backbone` and the teacher (built here,
        from its own config, with its weights: it is not trained)."""
        encoder = self.teacher_config.build(load_pretrained=True)
        objective = follow_grad_checkpointing(head(backbone.embed_dim, encoder.embed_dim), backbone)
        self.__dict__["_built_teacher"] = FrozenTeacher(
            encoder,
            getattr(objective, "teacher_blocks", 1),
            None if self.teacher_precision == "auto" else False,
            self.teacher_scale,
        )
        return objective

    def build_model(self, backbone: VisionTransformer, head: nn.Module) -> FeatureDistillationModel:
        return FeatureDistillationModel(backbone, head, self.__dict__.pop("_built_teacher"))

    def setup(self, stage: str) -> None:
        super().setup(stage)
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        if getattr(datamodule, "mean", None) is not None and getattr(datamodule, "std", None) is not None:
            self.teacher.set_normalization(datamodule.mean, datamodule.std)
        if self.teacher_cache is not None and self._cache is None:
            self._cache = self.open_cache(datamodule)

    def open_cache(self, datamodule: Any) -> TeacherFeatureCache:
        """The cache, or an error if the data cannot use one (no image files, random views)."""
        scale, hflip = getattr(datamodule, "scale", None), getattr(datamodule, "hflip", 0.0)
        if (scale is not None and tuple(scale) != (1.0, 1.0)) or (hflip or 0.0) > 0:
            raise ConfigError(
                f"model.init_args.teacher_cache={self.teacher_cache}: the training views are random (scale={scale}, "
                f"hflip={hflip}) and cached teacher features are of one fixed view per image; set "
                "data.init_args.scale=[1.0, 1.0] and data.init_args.hflip=0.0, or teacher_cache: null"
            )
        key = TeacherFeatureCache.teacher_key(
            self.teacher_config, self.teacher.blocks, self.teacher.uses_bf16(self.device)
        )
        cache = TeacherFeatureCache(self.teacher_cache, key)
        rank_zero_info(f"teacher features cached in {cache.root}")
        return cache

    def sources_of(self, stage: Stage) -> list:
        """The image files of `stage`'s dataset, by sample index (the cache's keys)."""
        name = {"train": "train_dataset", "val": "val_dataset", "test": "test_dataset"}.get(stage)
        dataset = getattr(getattr(self.trainer, "datamodule", None), name or "", None)
        paths = getattr(dataset, "paths", None)
        if paths is None:
            raise ConfigError(
                f"model.init_args.teacher_cache: the {stage} data ({type(dataset).__name__}) are not image files "
                "(no .paths), and the cache is keyed by image file; use UnlabeledImagesDataModule or teacher_cache: null"
            )
        return paths

    def teacher_features(self, batch: LabeledImages, sources: list) -> TeacherFeatures:
        """The teacher's features of the batch, from the cache where it has them; a batch with
        any image not cached runs the teacher once and stores those. `sources`: the image files
        of the batch's dataset, by sample index."""
        if self._cache is None:
            raise ConfigError("teacher_features reads the cache: set model.init_args.teacher_cache")
        images = batch.image
        sizes = batch.image_sizes or ImageSizes.full(images.shape[0], tuple(images.shape[-2:]))
        files = [sources[int(i)] for i in batch.index.tolist()]
        views = [view_fingerprint(images[i, :, :h, :w]) for i, (h, w) in enumerate(sizes.sizes)]
        cached = [self._cache.get(f, v) for f, v in zip(files, views, strict=True)]
        teacher_sizes = self.teacher.input_sizes(sizes).at_stride(self.teacher.encoder.patch_size)
        if any(c is None for c in cached):
            computed = self.teacher(images, sizes)
            for i, (h, w) in enumerate(teacher_sizes.grids):
                if cached[i] is None:
                    self._cache.put(files[i], views[i], computed.patches[i, :h, :w], computed.pooled[i])
            return computed
        patches = images.new_zeros(images.shape[0], *teacher_sizes.grid, cached[0][0].shape[-1])
        for i, ((h, w), (p, _)) in enumerate(zip(teacher_sizes.grids, cached, strict=True)):
            patches[i, :h, :w] = p.to(patches)
        pooled = torch.stack([q for _, q in cached]).to(patches)
        return TeacherFeatures(patches, pooled, teacher_sizes)

    def forward_batch(self, batch: LabeledImages, stage: Stage) -> DistillationOutput:
        cached = None
        if self._cache is not None and stage in ("train", "val", "test"):
            cached = self.teacher_features(batch, self.sources_of(stage))
        return self.model(batch.image, batch.image_sizes, cached)

    def compute_loss(self, output: DistillationOutput, batch: LabeledImages, stage: Stage) -> Losses:
        losses = self.objective.losses(output)
        total = losses.pop("loss")
        return Losses(total, losses)

    def plain_inference(self) -> FeatureDistillationInference:
        """The student and projectors rebuilt without the task (`vitdense.load_model`,
        `export --format weights`); it predicts nothing."""
        return FeatureDistillationInference(teacher_dim=self.teacher.embed_dim)
