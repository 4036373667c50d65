"""Monocular depth estimation with DPT (Ranftl et al., "Vision Transformers for Dense
Prediction", ICCV 2021): a ViT, `DPTHead`, and a depth loss.

Training runs on crops of one size (DPT has no padding contract, `vitdense.models.DPT`);
validation, test and prediction run each image at its evaluation size (images of one size
together, unpadded) and resize the prediction to the size its depth was measured at, where
the metrics are computed (BTS's and DPT's evaluation: NYU at 480 x 640 with Eigen's crop,
KITTI with Garg's).

    output    loss                         trained as               evaluated as
    metric    SILogLoss (BTS)              metric depth             itself
    inverse   SILogLoss                    DPT's 1 / (s x + t)      1 / (s x + t), s, t fixed
    inverse   ScaleShiftInvariantLoss      relative inverse depth   aligned per image (MiDaS), inverted
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn
from torchmetrics import MetricCollection

from vitdense.backbone import VisionTransformer
from vitdense.core.errors import ConfigError
from vitdense.heads.dpt import DPTHead, dpt_hooks
from vitdense.heads.factory import HeadSpec, head_factory
from vitdense.losses.depth import SILogLoss, compute_scale_and_shift
from vitdense.metrics.depth import DEPTH_METRIC_NAMES, DepthMetrics
from vitdense.models.depth import DPT, DepthOutputKind, DPTInference
from vitdense.results.depth import DepthResult
from vitdense.tasks.base import DEFAULT_BACKBONE, BackboneConfig, BaseTask, HeadFactory, Stage
from vitdense.tasks.pictures import draw_depth
from vitdense.training.optim import DEFAULT_LR_SCHEDULER, DEFAULT_OPTIMIZER
from vitdense.types import Losses, Size
from vitdense.types.depth import DepthImages, DepthOutput, DepthPrediction

#: the training loss, built without arguments; in YAML a class_path (+ init_args), e.g.
#: vitdense.losses.ScaleShiftInvariantLoss
LossFactory = Callable[[], nn.Module]

#: DPT's head: 256 fusion channels, the class token projected into every patch token
DEFAULT_DPT_HEAD = partial(DPTHead, features=256, readout="project")


def align_inverse_depth(raw: torch.Tensor, target: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """A relative inverse depth [h, w] aligned to a metric target [h, w] by the least-squares
    scale and shift of inverse depth over the valid pixels, then inverted (MiDaS's and DPT's
    evaluation of affine-invariant models: isl-org/DPT EVALUATION.md's NYU gist); the
    aligned inverse depth is kept at least 1e-8 before inverting."""
    target_inverse = torch.where(valid, 1.0 / target.clamp(min=1e-8), torch.zeros_like(target))
    scale, shift = compute_scale_and_shift((raw * valid)[None], target_inverse[None], valid[None])
    return 1.0 / (scale * raw + shift).clamp(min=1e-8)


def check_stage_maps(head: DPTHead, backbone: VisionTransformer) -> None:
    """A DPT-Hybrid head's CNN stages exist in the backbone's hybrid stem and their channels
    are the head's `out_channels` for them (R50: 256 and 512, DPT's)."""
    embed = backbone.patch_embed
    if not hasattr(embed, "stage_channels"):
        raise ConfigError(
            f"DPTHead stage_maps={head.stage_maps} reads a hybrid CNN's stages, but the backbone has a plain patch "
            "embedding: use a hybrid backbone (e.g. vit_base_r50_s16_384) or stage_maps: 0"
        )
    layers = (head.scratch.layer1_rn, head.scratch.layer2_rn)[: head.stage_maps]  # the maps the stages become
    for i, (stage, layer) in enumerate(zip(head.stage_hooks, layers, strict=True), 1):
        try:
            channels = embed.stage_channels(stage)
        except ValueError as err:
            raise ConfigError(f"DPTHead hooks: {err}") from None
        if channels != layer.in_channels:
            raise ConfigError(
                f"DPTHead out_channels[{i - 1}]={layer.in_channels}, but the hybrid CNN's stage {stage} has "
                f"{channels} channels: set out_channels[{i - 1}] to {channels} (DPT-Hybrid: [256, 512, 768, 768])"
            )


class DepthTask(BaseTask):
    """Monocular depth estimation with a DPT head.

    Logs `{stage}/loss`, and per epoch `{stage}/d1`, `d2`, `d3`, `abs_rel`, `sq_rel`,
    `rmse`, `rmse_log`, `log10`, `silog` (`DepthMetrics`: per image over its valid pixels,
    then the mean over images) with a table in the log.

    Args:
        num_classes: 1 (linked from the DataModule: one output channel, depth).
        head: `head(embed_dim, 1)` -> a `DPTHead`; its `hooks` default to DPT's blocks for
            the backbone's depth (`dpt_hooks`) unless the head's init_args name them.
        loss: `loss()` -> the training loss over [B, H, W] maps and a valid mask (recorded in
            checkpoints as the head is): `SILogLoss` (BTS's, variance focus 0.85) on metric depth, or `ScaleShiftInvariantLoss` (MiDaS) on
            inverse depth (relative depth; needs output "inverse"). A loss declares which
            with its `space` ("depth" or "disparity"; "depth" if it says nothing).
        output: "metric" (the head predicts depth) or "inverse" (inverse depth, DPT's).
        inverse_scale, inverse_shift: with output "inverse" and a depth-space loss, depth =
            1 / (scale x + shift) (DPT's NYU model: 0.000305, 0.1378).
        init_depth: the depth (metres) the untrained head starts at everywhere (its output
            convolution's bias set to that depth's output, `DPTHead.start_output_at`); None:
            max_depth / 2, where a sigmoid head such as Depth Anything's metric one starts.
            PyTorch's own initialisation leaves DPT's final ReLU at 0 on every pixel for about
            half the seeds, and such a head never learns (a pre-trained head's weights replace
            this start when they load).
        min_depth, max_depth: valid range of the ground truth, for the loss's mask and the
            metrics (NYU: 1e-3, 10; KITTI: 1e-3, 80).
        crop: the metrics' crop: "eigen" (NYU), "garg" (KITTI) or "none".
        png_scale: units per metre of the 16-bit PNGs `predict` writes (NYU's 1000, mm).
        class_names: linked from the DataModule (["depth"]).
        (the rest: see `BaseTask`)
    """

    result_type: ClassVar[type] = DepthResult
    monitor: ClassVar[str] = "val/abs_rel"
    mode: ClassVar[Literal["min", "max"]] = "min"
    evaluation_settings: ClassVar[tuple[str, ...]] = (
        *BaseTask.evaluation_settings,
        "min_depth",
        "max_depth",
        "crop",
        "png_scale",
    )

    def __init__(
        self,
        num_classes: int = 1,
        head: HeadFactory = DEFAULT_DPT_HEAD,
        loss: LossFactory = SILogLoss,
        output: DepthOutputKind = "metric",
        inverse_scale: float = 1.0,
        inverse_shift: float = 0.0,
        init_depth: float | None = None,
        min_depth: float = 1e-3,
        max_depth: float = 10.0,
        crop: Literal["none", "eigen", "garg"] = "none",
        png_scale: float = 1000.0,
        class_names: list[str] | None = None,
        backbone: BackboneConfig = DEFAULT_BACKBONE,
        optimizer: OptimizerCallable = DEFAULT_OPTIMIZER,
        lr_scheduler: LRSchedulerCallable = DEFAULT_LR_SCHEDULER,
        lr_interval: Literal["step", "epoch"] = "step",
        compile: bool | dict[str, Any] = False,
    ) -> None:
        if num_classes != 1:
            raise ConfigError(f"DepthTask predicts one channel (depth), not num_classes={num_classes}")
        if not 0 <= min_depth < max_depth:
            raise ConfigError(f"DepthTask: need 0 <= min_depth < max_depth, got {min_depth} and {max_depth}")
        loss_factory = head_factory(loss)  # (a checkpoint passes back the recorded {class_path, init_args})
        criterion = loss_factory()
        space = getattr(criterion, "space", "depth")
        if space not in ("depth", "disparity"):
            raise ConfigError(f"{type(criterion).__name__}.space={space!r}: expected 'depth' or 'disparity'")
        if space == "disparity" and output != "inverse":
            raise ConfigError(
                f"{type(criterion).__name__} compares inverse depth (relative, MiDaS's): set output: inverse"
            )
        # read by the hooks the base calls (configure_head, build_model, configure_metrics)
        self.output, self.relative = output, space == "disparity"
        self.inverse_scale, self.inverse_shift = inverse_scale, inverse_shift
        self.init_depth = init_depth if init_depth is not None else max_depth / 2
        if self.init_depth <= 0:
            raise ConfigError(f"DepthTask: init_depth={init_depth} must be positive (metres)")
        self.min_depth, self.max_depth, self.crop = min_depth, max_depth, crop
        super().__init__(
            num_classes=1,
            head=head,
            class_names=class_names or ["depth"],
            backbone=backbone,
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            lr_interval=lr_interval,
            compile=compile,
        )
        self.png_scale = png_scale
        self.loss = criterion
        if (spec := HeadSpec.of(loss_factory)) is not None:
            self.hparams["loss"] = spec.as_data()  # plain data, as the head: the checkpoint rebuilds it
        else:
            self.hparams.pop("loss", None)

    def configure_head(self, head: HeadFactory, backbone: VisionTransformer) -> nn.Module:
        """The head, reading DPT's blocks for the backbone's depth unless its `hooks` are
        given; a DPT-Hybrid head's CNN stages checked against the backbone's CNN."""
        module = super().configure_head(head, backbone)
        stage_maps = getattr(module, "stage_maps", 0)
        if not getattr(module, "hooks_given", True):
            try:
                module.hooks = dpt_hooks(backbone.depth, stage_maps)
            except ValueError as err:
                raise ConfigError(str(err)) from None
        blocks = module.hooks[stage_maps:]
        if bad := [i for i in blocks if not -backbone.depth <= i < backbone.depth]:
            raise ConfigError(f"DPTHead hooks {bad} are out of range for a backbone of {backbone.depth} blocks")
        if stage_maps:
            check_stage_maps(module, backbone)
        if hasattr(module, "start_output_at"):
            module.start_output_at(self.initial_output())
        return module

    def initial_output(self) -> float:
        """The head's output for `init_depth`: the depth itself ("metric"), or its inverse
        through DPT's affine map, (1 / d - shift) / scale ("inverse"; the raw inverse depth
        of a relative model, whose scale is arbitrary)."""
        if self.output == "metric":
            return self.init_depth
        value = (1.0 / self.init_depth - self.inverse_shift) / self.inverse_scale
        if value <= 0:
            raise ConfigError(
                f"DepthTask: init_depth {self.init_depth:g} m is at or beyond 1 / (inverse_shift) = "
                f"{1 / self.inverse_shift:g} m, where the inverse head's ReLU output is 0 (no gradient): choose a "
                "nearer init_depth"
            )
        return value

    def build_model(self, backbone: VisionTransformer, head: nn.Module) -> DPT:
        return DPT(backbone, head, self.output, self.inverse_scale, self.inverse_shift, self.relative)

    def configure_metrics(self) -> MetricCollection:
        return MetricCollection({"depth": DepthMetrics(self.min_depth, self.max_depth, self.crop)})

    def valid(self, target: torch.Tensor) -> torch.Tensor:
        """Pixels with a measurement in the valid range (min_depth, max_depth)."""
        return (target > self.min_depth) & (target < self.max_depth)

    def to_depth(self, raw: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Metric depth from the model's output: aligned to `target` for a relative model."""
        if self.relative:
            return align_inverse_depth(raw, target, self.valid(target))
        return self.model.depth(raw)

    def forward_batch(self, batch: DepthImages, stage: Stage) -> DepthOutput:
        """Training: the batch's crops (one size). Evaluation: each image at its evaluation
        size, the output resized to its depth map's size."""
        if stage == "train":
            if batch.image_sizes.has_padding:
                raise ConfigError(
                    "DPT trains on batches of one size (it is not padding-invariant): crop training images to one "
                    "size (data.init_args.crop_size)"
                )
            raw = self(batch.image, batch.image_sizes)[:, 0]
            return DepthOutput([raw], [batch.depth], [raw])
        sizes = batch.depth_sizes.sizes
        raws = self.model.estimate(batch.image, batch.image_sizes, sizes)
        targets = [batch.depth[i, :h, :w] for i, (h, w) in enumerate(sizes)]
        preds = [self.to_depth(r, t) for r, t in zip(raws, targets, strict=True)] if stage != "predict" else raws
        return DepthOutput([p[None] for p in preds], [t[None] for t in targets], [r[None] for r in raws])

    def compute_loss(self, output: DepthOutput, batch: DepthImages, stage: Stage) -> Losses:
        """The loss over the valid pixels: of the batch (training), or the mean of each
        image's (evaluation, images of different sizes)."""
        losses = []
        for raw, target in zip(output.raw, output.targets, strict=True):
            valid = self.valid(target)
            if self.relative:
                pred, goal = raw, torch.where(valid, 1.0 / target.clamp(min=1e-8), torch.zeros_like(target))
            else:
                pred, goal = self.model.depth(raw), target
            losses.append(self.loss(pred, goal, valid))
        return Losses(torch.stack(losses).mean())

    def update_metrics(self, metrics: MetricCollection, output: DepthOutput, batch: DepthImages, stage: Stage) -> None:
        metrics["depth"].update([p[0] for p in output.preds], [t[0] for t in output.targets])

    def format_table(self, result: dict[str, Any], stage: Stage) -> str:
        """The epoch's nine figures on one line (δ's in [0, 1], errors in metres)."""
        figures = "  ".join(f"{k} {result[f'{stage}/{k}'].item():.4f}" for k in DEPTH_METRIC_NAMES)
        return f"{stage} epoch {self.current_epoch}: {figures}"

    def draw_batch(self, batch: DepthImages, pixels: list[np.ndarray], palette: np.ndarray) -> list[np.ndarray]:
        """Per image: the image, its ground truth and the prediction (evaluation's), colourised."""
        output = self.forward_batch(batch, "val")
        return [
            draw_depth(image, target[0].float().cpu().numpy(), pred[0].float().cpu().numpy())
            for image, pred, target in zip(pixels, output.preds, output.targets, strict=True)
        ]

    def predict_sample(self, image: torch.Tensor, size: Size, index: int) -> DepthImages:
        """No measurement at (H0, W0): depth is predicted at that size."""
        return DepthImages.unlabeled(image, size, index)

    def predict_step(self, batch: DepthImages | None, batch_idx: int) -> DepthPrediction | None:
        if batch is None:  # every image of the batch was unreadable and skipped (on_bad_sample=skip)
            return None
        raws = self.model.estimate(batch.image, batch.image_sizes, batch.depth_sizes.sizes)
        depths = raws if self.relative else [self.model.depth(r) for r in raws]
        return DepthPrediction(batch.index, depths, self.relative, self.png_scale)

    def plain_inference(self) -> DPTInference:
        """`predict_step` without the task: depth (a relative model's inverse depth) at each
        image's size, with the head's blocks and the model's output map (`vitdense.models`)."""
        model = self.model
        return DPTInference(
            list(model.head.hooks), model.output, model.scale, model.shift, model.relative, self.png_scale
        )
