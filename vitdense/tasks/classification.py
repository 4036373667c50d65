"""Image classification fine-tuning (paper section 3.2 and appendix B.1.1)."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import timm
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from timm.data import IMAGENET_DEFAULT_MEAN as IMAGENET_MEAN
from timm.data import IMAGENET_DEFAULT_STD as IMAGENET_STD
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy
from torch import nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from vitdense.backbone.pretrained import _encoder_tensors, read_state_dict
from vitdense.core.errors import ConfigError
from vitdense.heads import ClassificationHead, DistilledClassificationHead
from vitdense.losses.distillation import DistillationType, combine_token_distillation
from vitdense.models.classification import ClassifierInference, top_k_prediction
from vitdense.results.classification import ClassificationResult
from vitdense.tasks.base import DEFAULT_BACKBONE, BackboneConfig, BaseTask, HeadFactory, Stage
from vitdense.tasks.pictures import draw_classified
from vitdense.training.optim import DEFAULT_LR_SCHEDULER, DEFAULT_OPTIMIZER
from vitdense.types import ClassificationOutput, ClassPrediction, LabeledImages, Losses

_logger = logging.getLogger(__name__)

#: the paper's head: a linear layer on the class token, zero-initialised on a pre-trained backbone
DEFAULT_CLASSIFICATION_HEAD = partial(ClassificationHead, pool="token")


def accuracy_metrics(num_classes: int) -> MetricCollection:
    """Top-1 and top-5 accuracy, micro: the fraction of images whose label is in the top k,
    as the papers report (torchmetrics' default "macro" averages per-class accuracies)."""
    top_k = {"acc1": 1, "acc5": 5}
    return MetricCollection(
        {name: MulticlassAccuracy(num_classes, top_k=min(k, num_classes), average="micro") for name, k in top_k.items()}
    )


class ClassificationTask(BaseTask):
    """Fine-tune a ViT with a classification head. Logs `{stage}/loss`, `{stage}/acc1` and
    `{stage}/acc5` (training accuracy too).

    Args:
        num_classes: K (linked from the DataModule by the CLI).
        head: `head(embed_dim, num_classes)`; default `ClassificationHead` on the class token
            (YAML: `class_path: vitdense.heads.ClassificationHead`, `init_args: {pool: avg, drop_rate: 0.1}`).
        label_smoothing: cross-entropy label smoothing.
        mixup_alpha, cutmix_alpha: timm's Mixup/CutMix on training batches (0 = off); the
            loss then becomes soft-target cross-entropy (smoothing folded into the targets).
        class_names: names of the K classes, for predictions (linked from the DataModule).
        distillation: DeiT's token distillation (Touvron et al., ICML 2021): "hard" (the
            distillation head learns the teacher's argmax) or "soft" (KL at temperature
            `distillation_tau`); None: off. Needs a backbone with a distillation token (timm's
            `deit_*_distilled_*`) and `head: vitdense.heads.DistilledClassificationHead`.
            Losses as timm 1.0.31's `TokenDistillationTask` (`vitdense.losses.distillation`).
        distillation_alpha: weight of the distillation loss; the label loss weighs 1 - alpha
            (DeiT: 0.5).
        distillation_tau: softmax temperature of soft distillation (DeiT: 1).
        teacher_checkpoint: the teacher as a vitdense classification checkpoint (.ckpt of a
            `ClassificationTask` run, loaded as `vitdense.load_model` does).
        teacher_model: or the teacher as a timm model name with `teacher_weights`, a local
            weights file (timm format, read with torch.load(weights_only=True) unless
            `teacher_trust_weights`), and `teacher_model_args` (timm overrides).
            The teacher is frozen, in evaluation mode, without gradients, and not saved in the
            task's checkpoints. It sees the student's normalised batch: a timm teacher's
            normalisation (its `pretrained_cfg` mean/std) is converted from the DataModule's
            (timm's `DistillationTeacher.normalize_input`) and the batch resized (bilinear) to
            its fixed input size where that differs; a vitdense teacher takes any size, and a
            mean/std other than the DataModule's is refused.
        (the rest: see `BaseTask`)
    """

    result_type: ClassVar[type] = ClassificationResult
    monitor: ClassVar[str] = "val/acc1"
    mode: ClassVar[Literal["min", "max"]] = "max"
    log_train_metrics: ClassVar[bool] = True

    def __init__(
        self,
        num_classes: int,
        head: HeadFactory = DEFAULT_CLASSIFICATION_HEAD,
        label_smoothing: float = 0.0,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        class_names: list[str] | None = None,
        distillation: DistillationType | None = None,
        distillation_alpha: float = 0.5,
        distillation_tau: float = 1.0,
        teacher_checkpoint: str | None = None,
        teacher_model: str | None = None,
        teacher_weights: str | None = None,
        teacher_trust_weights: bool = False,
        teacher_model_args: dict[str, Any] | None = None,
        backbone: BackboneConfig = DEFAULT_BACKBONE,
        optimizer: OptimizerCallable = DEFAULT_OPTIMIZER,
        lr_scheduler: LRSchedulerCallable = DEFAULT_LR_SCHEDULER,
        lr_interval: Literal["step", "epoch"] = "step",
        compile: bool | dict[str, Any] = False,
    ) -> None:
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
        self.label_smoothing = label_smoothing
        self.distillation = distillation
        self.distillation_alpha, self.distillation_tau = distillation_alpha, distillation_tau
        self._teacher_source = (teacher_checkpoint, teacher_model, teacher_weights, teacher_trust_weights)
        self._teacher_model_args = dict(teacher_model_args or {})
        self._check_distillation()
        #: the frozen teacher, built in `setup("fit")`; kept in a tuple, out of the module tree,
        #: so that it is neither saved in checkpoints nor given to the optimizer
        self._teacher: tuple[nn.Module, ...] = ()
        self._student_norm: tuple[Any, Any] = (None, None)
        self.mixup = None
        if mixup_alpha > 0 or cutmix_alpha > 0:
            self.mixup = Mixup(
                mixup_alpha=mixup_alpha,
                cutmix_alpha=cutmix_alpha,
                label_smoothing=label_smoothing,
                num_classes=num_classes,
            )
            self.soft_target_loss = SoftTargetCrossEntropy()

    def _check_distillation(self) -> None:
        """Refuse inconsistent distillation settings before anything is trained."""
        checkpoint, model, weights, _ = self._teacher_source
        key = "model.init_args.distillation"
        if self.distillation is None:
            if checkpoint or model:
                raise ConfigError(f"a teacher is given but {key} is not set; set it to hard or soft")
            return
        if self.distillation not in ("hard", "soft"):
            raise ConfigError(f"{key}={self.distillation!r}: expected hard or soft")
        if self.backbone.dist_token is None:
            raise ConfigError(
                f"{key}={self.distillation}: backbone {self.backbone_config.name!r} has no distillation token; use a "
                "timm deit_*_distilled_* name (model.init_args.backbone.name: deit_tiny_distilled_patch16_224) "
                "or unset distillation"
            )
        if not isinstance(self.head, DistilledClassificationHead):
            raise ConfigError(
                f"{key}={self.distillation}: the head must be vitdense.heads.DistilledClassificationHead (DeiT's "
                f"head and head_dist), not {type(self.head).__name__}; set model.init_args.head.class_path"
            )
        if bool(checkpoint) == bool(model):
            raise ConfigError(
                f"{key}={self.distillation}: give the teacher as exactly one of model.init_args.teacher_checkpoint "
                "(a vitdense classification .ckpt) or model.init_args.teacher_model (a timm name, with "
                "teacher_weights: a local file)"
            )
        if model and not weights:
            raise ConfigError(
                f"model.init_args.teacher_model={model!r} needs model.init_args.teacher_weights (a local weights "
                "file; nothing is downloaded)"
            )
        if not 0.0 <= self.distillation_alpha <= 1.0 or self.distillation_tau <= 0:
            raise ConfigError("model.init_args.distillation_alpha must be in [0, 1] and distillation_tau > 0")
        self.head.set_distilled_training(True)

    def configure_head(self, head: Any, backbone: Any) -> nn.Module:
        module = super().configure_head(head, backbone)
        if isinstance(module, DistilledClassificationHead):
            if backbone.dist_token is None:
                raise ConfigError(
                    "model.init_args.head: DistilledClassificationHead needs a backbone with a distillation token "
                    "(a timm deit_*_distilled_* name in model.init_args.backbone.name); use ClassificationHead"
                )
            config = self.backbone_config
            if config.checkpoint is not None and Path(config.checkpoint).suffix.lower() != ".npz":
                # timm's deit_*_distilled_* files carry head and head_dist: keep them when K fits
                tensors = _encoder_tensors(read_state_dict(config.checkpoint, config.trust_checkpoint))
                kept = module.load_timm_heads(tensors)
                _logger.info("%s: head and head_dist %s", config.checkpoint, "loaded" if kept else "not loaded")
        return module

    def build_teacher(self, mean: Any = None, std: Any = None) -> nn.Module:
        """The frozen teacher (`teacher_checkpoint` or `teacher_model`), as timm's
        `DistillationTeacher` (eval mode, `normalize_input`); `mean`, `std`: the student's
        normalisation (the DataModule's), None when unknown (taken as the teacher's)."""
        checkpoint, name, weights, trust = self._teacher_source
        # (checked here, not in __init__: a distilled run's checkpoint restores without its teacher)
        for key, path in (("teacher_checkpoint", checkpoint), ("teacher_weights", weights)):
            if path and not Path(path).is_file():
                raise ConfigError(f"model.init_args.{key}: {path} does not exist")
        if checkpoint:
            from vitdense.deploy.checkpoint import Checkpoint

            ckpt = Checkpoint(checkpoint)
            model = ckpt.for_inference().model
            recorded = ((ckpt.inference or {}).get("preprocess") or {}) if ckpt.inference else {}
            if mean is not None and recorded.get("mean") is not None:
                theirs = (list(map(float, recorded["mean"])), list(map(float, recorded["std"])))
                ours = (list(map(float, mean)), list(map(float, std)))
                if not np.allclose(theirs, ours):
                    raise ConfigError(
                        f"teacher_checkpoint {checkpoint} was trained with mean/std {theirs}, the student's data uses "
                        f"{ours}; set data.init_args.mean/std to the teacher's (the teacher sees the student's batch)"
                    )
            # the teacher takes the student's normalisation as it is (checked equal above)
            model.pretrained_cfg = {"mean": tuple(mean or IMAGENET_MEAN), "std": tuple(std or IMAGENET_STD)}
        else:
            model = timm.create_model(name, pretrained=False, num_classes=self.num_classes, **self._teacher_model_args)
            tensors = _encoder_tensors(read_state_dict(weights, trust))
            try:
                model.load_state_dict(tensors)
            except RuntimeError as err:
                raise ConfigError(
                    f"model.init_args.teacher_weights {weights} does not fit teacher_model {name!r} with "
                    f"num_classes={self.num_classes}: {err}"
                ) from err
        if getattr(model, "num_classes", self.num_classes) != self.num_classes:
            raise ConfigError(f"teacher has {model.num_classes} classes, the task {self.num_classes}")
        try:  # (timm >= 1.0.23; imported here: the rest of the task works with older timm)
            from timm.task.distillation import DistillationTeacher
        except ImportError as err:
            raise ConfigError(
                f"model.init_args.teacher_model: a timm teacher needs timm >= 1.0.23 (timm.task); this is timm "
                f"{timm.__version__}: `pip install -U timm`, or use teacher_checkpoint (a vitdense run)"
            ) from err
        teacher = DistillationTeacher(model)
        teacher.requires_grad_(False)
        return teacher.eval()

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if stage == "fit" and self.distillation is not None and not self._teacher:
            data = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
            self._teacher = (self.build_teacher(getattr(data, "mean", None), getattr(data, "std", None)),)
            self._student_norm = (getattr(data, "mean", None), getattr(data, "std", None))

    def teacher_logits(self, images: torch.Tensor, image_sizes: Any) -> torch.Tensor:
        """The frozen teacher's logits [B, K] on the student's (normalised, padded) batch."""
        if not self._teacher:  # (trained without a Trainer's setup: the data's normalisation is unknown)
            self._teacher = (self.build_teacher(),)
        teacher = self._teacher[0].to(images.device).eval()
        model = teacher.model
        with torch.no_grad():
            mean, std = self._student_norm
            if mean is not None:
                mean_s = torch.tensor(mean, device=images.device, dtype=images.dtype).view(1, -1, 1, 1)
                std_s = torch.tensor(std, device=images.device, dtype=images.dtype).view(1, -1, 1, 1)
                images = teacher.normalize_input(images, mean_s, std_s)
            if hasattr(model, "backbone"):  # a vitdense model: any size, padding-aware
                return model(images, image_sizes).float()
            size = getattr(getattr(model, "patch_embed", None), "img_size", None)
            if (
                size is not None
                and not getattr(model, "dynamic_img_size", False)
                and tuple(images.shape[-2:]) != tuple(size)
            ):
                images = F.interpolate(images, size=tuple(size), mode="bilinear", align_corners=False)
            return teacher(images).float()

    def configure_metrics(self) -> MetricCollection:
        return accuracy_metrics(self.num_classes)

    def forward_batch(self, batch: LabeledImages, stage: Stage) -> ClassificationOutput:
        images, targets = batch.image, None
        if self.mixup is not None and stage == "train":
            if images.shape[0] % 2:
                raise ConfigError("Mixup/CutMix need an even batch size (the train loader drops the last batch)")
            images, targets = self.mixup(images, batch.label)
        logits = self(images, batch.image_sizes)
        if isinstance(logits, tuple):  # distilled training: (class head, distillation head), DeiT's section 4
            logits, dist_logits = logits
            if stage == "train":  # (read once by compute_loss; elsewhere the heads predict as at inference)
                self._distill_pair = (dist_logits, self.teacher_logits(images, batch.image_sizes))
            else:
                logits = (logits + dist_logits) / 2
        return ClassificationOutput(logits, targets)

    def compute_loss(self, output: ClassificationOutput, batch: LabeledImages, stage: Stage) -> Losses:
        if output.soft_targets is not None:
            loss = self.soft_target_loss(output.logits, output.soft_targets)
        else:
            loss = F.cross_entropy(output.logits, batch.label, label_smoothing=self.label_smoothing)
        pair = self.__dict__.pop("_distill_pair", None)
        if pair is None:
            return Losses(loss)
        parts = combine_token_distillation(
            loss, *pair, self.distillation, self.distillation_alpha, self.distillation_tau
        )
        return Losses(parts.loss, {"task_loss": parts.task_loss.detach(), "distill_loss": parts.distill_loss.detach()})

    def update_metrics(
        self, metrics: MetricCollection, output: ClassificationOutput, batch: LabeledImages, stage: Stage
    ) -> None:
        metrics.update(output.logits, batch.label)

    def draw_batch(self, batch: LabeledImages, pixels: list[np.ndarray], palette: np.ndarray) -> list[np.ndarray]:
        """One grid: each image with its true and predicted class (green if right, red if not)."""
        probs = self.forward_batch(batch, "val").logits.softmax(-1)
        return [draw_classified(pixels, batch.label.tolist(), probs, self.class_names)]

    def predict_step(self, batch: LabeledImages | None, batch_idx: int) -> ClassPrediction | None:
        if batch is None:  # every image of the batch was unreadable and skipped (on_bad_sample=skip)
            return None
        return top_k_prediction(self.forward_batch(batch, "predict").logits, batch.index)

    def plain_inference(self) -> ClassifierInference:
        """`predict_step` without the task: the model's top-5 classes (`vitdense.models`)."""
        return ClassifierInference(self.num_classes)
