"""Universal segmentation, EoMT's way: one plain ViT with queries in its last blocks
(`vitdense.models.EoMT`) for semantic, instance or panoptic segmentation, trained with
Mask2Former's loss (`vitdense.losses.MaskSetCriterion`).

What the task evaluates and predicts is its `segmentation`:

    panoptic   PanopticImages (COCO panoptic) -> PQ, SQ, RQ (All, Things, Stuff)  -> panoptic PNG + JSON
    instance   PanopticImages (COCO instances) -> mask AP (COCOeval's 12 stats)   -> COCO results JSON (RLE)
    semantic   SegmentedImages (ADE20K, ...)   -> mIoU, sliding windows            -> label-map PNGs

A panoptic run may also report the other two (`evaluate`), each from the same queries. A
model's instances are its things, as Mask2Former's (`instance_inference` with `panoptic_on`)
evaluated on COCO's instances JSON: mask AP and the instances it predicts leave the stuff
classes out, of the predictions and of the ground truth (instance data has things only).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn
from torchmetrics import MetricCollection

from vitdense.backbone import VisionTransformer
from vitdense.core.errors import ConfigError
from vitdense.deploy.slicing import SlicedImages, predict_sliced
from vitdense.heads.eomt import EoMTHead
from vitdense.losses import MaskSetCriterion
from vitdense.metrics.segmentation import SegmentationMetrics
from vitdense.metrics.universal import PQ_KEYS, InstanceMeanAP, PanopticQuality
from vitdense.models.universal import (
    EoMT,
    EoMTInference,
    Segmentation,
    instance_inference,
    panoptic_inference,
    semantic_inference,
)
from vitdense.results.segmentation import SegmentationResult
from vitdense.results.universal import InstanceResult, PanopticResult
from vitdense.tasks.base import DEFAULT_BACKBONE, BackboneConfig, BaseTask, HeadFactory, Stage
from vitdense.tasks.detection import MAP_KEYS, CriterionFactory, map_backend
from vitdense.tasks.pictures import draw_panoptic, draw_segmented
from vitdense.training.optim import DEFAULT_LR_SCHEDULER, DEFAULT_OPTIMIZER
from vitdense.types import (
    ImageSizes,
    InstanceMasks,
    InstancePrediction,
    Losses,
    LossSum,
    MaskClassOutput,
    PanopticImages,
    PanopticPrediction,
    PanopticSegments,
    SegmentationPrediction,
    SegmentedImages,
    SegmentTargets,
    Size,
)

#: EoMT's head: 200 queries (panoptic, instance; 100 for semantic) in the last 4 blocks (3 for 12-layer models)
DEFAULT_EOMT_HEAD = partial(EoMTHead, num_queries=200, num_blocks=4)

#: an EoMT head from the backbone's width D, the number of classes K and the patch size (the
#: mask resolution follows it): `head(embed_dim, num_classes, patch_size)`; in YAML a class_path
#: (+ init_args for everything but those three), e.g. vitdense.heads.EoMTHead
EoMTHeadFactory = Callable[[int, int, int], nn.Module]

#: what each kind of evaluation logs, the first being the one checkpoints are chosen by
LOGGED = {
    "panoptic": PQ_KEYS,
    "instance": MAP_KEYS,
    "semantic": ("mIoU", "mAcc", "aAcc"),
}


def label_map_segments(label_map: torch.Tensor, num_classes: int, ignore_index: int = 255) -> SegmentTargets:
    """A semantic label map [h, w] as segments: one mask per class present, in class order
    (Mask2Former's and EoMT's semantic targets); `ignore_index` pixels are in none (void)."""
    labels = torch.unique(label_map)
    labels = labels[(labels != ignore_index) & (labels < num_classes)]
    masks = label_map[None] == labels[:, None, None]
    return SegmentTargets(masks, labels, torch.zeros(len(labels), dtype=torch.bool, device=label_map.device))


def sum_losses(losses: Sequence[Losses]) -> Losses:
    """Several images' evaluation `Losses` as one batch's: the totals and terms averaged over
    the images, the `sums` added (numerators and denominators)."""
    n = len(losses)
    terms = {k: sum(x.terms[k] for x in losses) / n for k in losses[0].terms}
    sums = {
        k: LossSum(sum(x.sums[k].numerator for x in losses), sum(x.sums[k].denominator for x in losses))
        for k in losses[0].sums
    }
    return Losses(sum(x.total for x in losses) / n, terms, sums)


def thing_segments(targets: SegmentTargets, is_thing: torch.Tensor) -> SegmentTargets:
    """The segments of thing classes (`is_thing` [K] bool), crowds included: the ground truth
    of mask AP, as COCO's instances JSON holds the things of its panoptic annotations."""
    keep = is_thing.to(targets.labels.device)[targets.labels]
    area = targets.area[keep] if targets.area is not None else None
    return SegmentTargets(targets.masks[keep], targets.labels[keep], targets.iscrowd[keep], area)


def semantic_map(targets: SegmentTargets, ignore_index: int = 255) -> torch.Tensor:
    """[H, W] int64 class of the segment under each pixel (crowd regions included, as
    detectron2's panoptic-to-semantic conversion), `ignore_index` where none is."""
    out = torch.full(targets.masks.shape[-2:], ignore_index, dtype=torch.int64, device=targets.masks.device)
    for mask, label in zip(targets.masks, targets.labels, strict=True):
        out[mask] = label
    return out


class UniversalSegmentationTask(BaseTask):
    """Semantic, instance or panoptic segmentation with EoMT.

    Training: the queries' class and mask logits of every joined block and the last are
    matched to the image's segments and scored by `criterion` (Mask2Former's loss at each
    block); each joined block's masked attention is annealed from applied (probability 1)
    to lifted (0) between its `attn_mask_annealing_start_steps` and `_end_steps` (EoMT's
    polynomial of power 0.9, staggered per block). Evaluation: the last block's prediction,
    without masks once annealed, resized to each image's original size and post-processed
    (`vitdense.models.universal`) as EoMT does.

    Logs `{stage}/loss` (and `loss_ce`, `loss_mask`, `loss_dice` per block), per epoch the
    metrics of `evaluate` (`{stage}/PQ` ... for panoptic, `{stage}/map` ... for instance,
    `{stage}/mIoU` ... for semantic), `train/attn_mask_prob_{i}` per step.

    Args:
        num_classes: K (linked from the DataModule).
        is_thing: per class, whether it is a thing (countable instances) or stuff (None:
            read off the DataModule's `is_thing` when training or evaluating starts;
            a DataModule without one has things only).
        segmentation: what the task evaluates and predicts (see the module docstring).
        evaluate: the evaluations of validation and test (default: `segmentation`'s own);
            a panoptic model can also report mask AP (of its thing classes) and mIoU, e.g.
            [panoptic, instance, semantic].
        head: `head(embed_dim, num_classes, patch_size)` -> an `EoMTHead` (default 200
            queries in the last 4 blocks).
        criterion: `criterion(num_classes)` -> the loss (default `MaskSetCriterion`,
            Mask2Former's: class 2, mask 5, dice 5, no-object 0.1, 12,544 points).
        attn_mask_annealing_start_steps, attn_mask_annealing_end_steps: per joined block,
            the optimizer steps over which its masked attention is annealed away (None: the
            masks apply throughout training and evaluation).
        score_threshold, overlap_threshold: panoptic post-processing (EoMT: 0.8, 0.8).
        top_k: (query, class) pairs taken per image as instances (EoMT: 100), of which a
            model with stuff classes keeps the things.
        ignore_index: unlabelled pixels of semantic label maps (linked from the DataModule).
        window, stride: semantic evaluation's sliding windows (default: the backbone's
            native size, without overlap).
        window_batch_size: windows run at once.
        (the rest: see `BaseTask`)
    """

    mode: ClassVar[Literal["min", "max"]] = "max"
    evaluation_settings: ClassVar[tuple[str, ...]] = (
        *BaseTask.evaluation_settings,
        "segmentation",
        "evaluate",
        "score_threshold",
        "overlap_threshold",
        "top_k",
        "window",
        "stride",
        "window_batch_size",
    )

    def __init__(
        self,
        num_classes: int,
        is_thing: list[bool] | None = None,
        segmentation: Segmentation = "panoptic",
        evaluate: list[Segmentation] | None = None,
        class_names: list[str] | None = None,
        head: EoMTHeadFactory = DEFAULT_EOMT_HEAD,
        criterion: CriterionFactory | None = None,
        attn_mask_annealing_start_steps: list[int] | None = None,
        attn_mask_annealing_end_steps: list[int] | None = None,
        score_threshold: float = 0.8,
        overlap_threshold: float = 0.8,
        top_k: int = 100,
        ignore_index: int = 255,
        window: int | None = None,
        stride: int | None = None,
        window_batch_size: int = 4,
        backbone: BackboneConfig = DEFAULT_BACKBONE,
        optimizer: OptimizerCallable = DEFAULT_OPTIMIZER,
        lr_scheduler: LRSchedulerCallable = DEFAULT_LR_SCHEDULER,
        lr_interval: Literal["step", "epoch"] = "step",
        compile: bool | dict[str, Any] = False,
    ) -> None:
        if is_thing is not None and len(is_thing) != num_classes:
            raise ConfigError(f"is_thing has {len(is_thing)} entries for {num_classes} classes")
        self.segmentation = segmentation
        self.evaluate = list(dict.fromkeys(evaluate or [segmentation]))
        if segmentation == "semantic" and self.evaluate != ["semantic"]:
            raise ConfigError("a semantic task evaluates mIoU only (its data has no instances): drop `evaluate`")
        #: per class, thing (True) or stuff; None until known (`setup` reads it off the data)
        self.is_thing = list(is_thing) if is_thing is not None else None
        self.ignore_index = ignore_index  # (read by configure_metrics, which the base calls)
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
        starts, ends = attn_mask_annealing_start_steps, attn_mask_annealing_end_steps
        if (starts is None) != (ends is None):
            raise ConfigError("give both attn_mask_annealing_start_steps and attn_mask_annealing_end_steps, or neither")
        if starts is not None:
            blocks = self.model.head.num_blocks
            if len(starts) != blocks or len(ends) != blocks:
                raise ConfigError(
                    f"attn_mask_annealing_start_steps / end_steps need one entry per joined block ({blocks}); "
                    f"got {len(starts)} and {len(ends)}"
                )
            if bad := [(s, e) for s, e in zip(starts, ends, strict=True) if not 0 <= s < e]:
                raise ConfigError(f"each annealing range needs 0 <= start < end steps; got {bad}")
        self.annealing = list(zip(starts, ends, strict=True)) if starts is not None else None
        self.score_threshold, self.overlap_threshold, self.top_k = score_threshold, overlap_threshold, top_k
        self.window = window or self.backbone.img_size[0]
        self.stride = stride or self.window
        self.window_batch_size = window_batch_size
        # the criterion shapes training only: a checkpoint restores with the default unless criterion= is given
        self.hparams.pop("criterion", None)
        self.criterion = (criterion or MaskSetCriterion)(num_classes)

    # ------------------------------------------------------------------ building
    @property
    def monitor(self) -> str:  # type: ignore[override]
        """The first evaluation's headline metric: val/PQ, val/map or val/mIoU."""
        return f"val/{LOGGED[self.evaluate[0]][0]}"

    @property
    def result_type(self) -> type:  # type: ignore[override]
        return {"panoptic": PanopticResult, "instance": InstanceResult, "semantic": SegmentationResult}[
            self.segmentation
        ]

    def configure_head(self, head: HeadFactory, backbone: VisionTransformer) -> nn.Module:
        """`head(embed_dim, num_classes, patch_size)`: the mask resolution follows the patch."""
        return head(backbone.embed_dim, self.num_classes, backbone.patch_size[0])

    def build_model(self, backbone: VisionTransformer, head: nn.Module) -> EoMT:
        return EoMT(backbone, head)

    def configure_metrics(self) -> MetricCollection:
        metrics: dict[str, Any] = {}
        if "panoptic" in self.evaluate and self.is_thing is not None:  # (else built in `setup`)
            metrics["panoptic"] = PanopticQuality(self.num_classes, self.is_thing)
        if "instance" in self.evaluate:
            # (no compute_on_cpu: the states are the masks' RLE, on the CPU already, which torchmetrics cannot move)
            metrics["instance"] = InstanceMeanAP(class_metrics=True, backend=map_backend())
        if "semantic" in self.evaluate:
            metrics["semantic"] = SegmentationMetrics(self.num_classes, self.ignore_index)
        return MetricCollection(metrics)

    def setup(self, stage: str) -> None:
        """Things and stuff from the data when the task was not told (`is_thing` of a
        panoptic DataModule): recorded in the hyperparameters, so that checkpoints keep it;
        instance data without it has things only."""
        super().setup(stage)
        if self.is_thing is not None:
            return
        datamodule = getattr(self.trainer, "datamodule", None)
        found = getattr(datamodule, "is_thing", None)
        if found is None and "panoptic" in self.evaluate + [self.segmentation]:
            raise ConfigError(
                "panoptic segmentation needs to know which classes are things: give model.init_args.is_thing, "
                "or use a DataModule with is_thing (CocoPanopticDataModule)"
            )
        self.is_thing = list(found) if found is not None else [True] * self.num_classes
        if len(self.is_thing) != self.num_classes:
            raise ConfigError(f"the data's is_thing has {len(self.is_thing)} entries for {self.num_classes} classes")
        self.hparams["is_thing"] = self.is_thing
        self.build_metrics()

    # ------------------------------------------------------------------ annealing
    def mask_probability(self, block: int, step: int) -> float:
        """Probability that joined block `block`'s masks apply at optimizer step `step`: 1
        before its range, (1 - progress) ** 0.9 within, 0 after (EoMT's `mask_annealing`)."""
        start, end = self.annealing[block]
        if step < start:
            return 1.0
        if step >= end:
            return 0.0
        return (1.0 - (step - start) / (end - start)) ** 0.9

    def anneal(self) -> None:
        """Set each joined block's mask probability for the next step."""
        if self.annealing is None:
            return
        probs = self.model.head.attn_mask_probs
        for i in range(len(probs)):
            probs[i] = self.mask_probability(i, self.global_step)

    def on_train_start(self) -> None:
        super().on_train_start()
        self.anneal()  # a resumed run continues where its step count is

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.anneal()
        if self.annealing is not None:
            for i, p in enumerate(self.model.head.attn_mask_probs.tolist()):
                self.log(f"train/attn_mask_prob_{i}", p, on_step=True, on_epoch=False)

    # ------------------------------------------------------------------ the loop
    def targets_of(self, batch: PanopticImages | SegmentedImages) -> Sequence[SegmentTargets]:
        """The segments to learn, per image (a semantic batch's label maps become one segment
        per class present)."""
        if isinstance(batch, SegmentedImages):
            return [
                label_map_segments(batch.mask[i, :h, :w], self.num_classes, self.ignore_index)
                for i, (h, w) in enumerate(batch.mask_sizes.sizes)
            ]
        return batch.targets

    def forward_batch(self, batch: PanopticImages | SegmentedImages, stage: Stage) -> MaskClassOutput:
        return self(batch.image, batch.image_sizes)

    def compute_loss(self, output: MaskClassOutput, batch: PanopticImages | SegmentedImages, stage: Stage) -> Losses:
        """Mask2Former's loss at every block in training. Evaluation scores the last block's
        prediction only (the one evaluated, so that the figure means the same before and
        after annealing), image by image as if each ran alone, with the loss's random points
        drawn from the image's index in its dataset: the split's figure is then the same for
        any batch size and number of processes."""
        sizes = batch.image_sizes.at_stride(self.model.mask_stride)
        if stage == "train":
            return self.criterion(output, self.targets_of(batch), sizes)
        targets = self.eval_loss_targets(batch)
        return sum_losses([self.image_loss(output, batch, i, t) for i, t in enumerate(targets)])

    def eval_loss_targets(self, batch: PanopticImages | SegmentedImages) -> Sequence[SegmentTargets]:
        """The segments an evaluation loss is scored on, at each image's pixels: a semantic
        batch's label maps (kept at their original size for the metrics) resized to the image
        (nearest) first."""
        if not isinstance(batch, SegmentedImages):
            return batch.targets
        out = []
        for i, ((h, w), (mh, mw)) in enumerate(zip(batch.image_sizes.sizes, batch.mask_sizes.sizes, strict=True)):
            label_map = batch.mask[i : i + 1, :mh, :mw]
            if (mh, mw) != (h, w):
                label_map = F.interpolate(label_map[None].float(), size=(h, w), mode="nearest")[0].long()
            out.append(label_map_segments(label_map[0], self.num_classes, self.ignore_index))
        return out

    def image_loss(self, output: MaskClassOutput, batch: Any, i: int, targets: SegmentTargets) -> Losses:
        """Image `i`'s evaluation loss against `targets`: its own part of the mask grid, its
        own points."""
        h, w = batch.image_sizes.sizes[i]
        patch, stride = self.backbone.patch_size, self.model.mask_stride
        rows, cols = -(-h // patch[0]) * patch[0] // stride, -(-w // patch[1]) * patch[1] // stride
        alone = MaskClassOutput(output.class_logits[i : i + 1], output.mask_logits[i : i + 1, :, :rows, :cols])
        generator = torch.Generator(output.mask_logits.device).manual_seed(int(batch.index[i]))
        sizes = ImageSizes.of([(h, w)]).at_stride(stride)
        return self.criterion(alone, [targets], sizes, generator=generator)

    def per_image(self, output: MaskClassOutput, batch: PanopticImages) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per image, class logits [Q, K + 1] and mask logits [Q, H0, W0] at its original size."""
        return self.model.image_logits(output, batch.image_sizes, batch.orig_sizes)

    def semantic_logits(self, batch: SegmentedImages) -> list[torch.Tensor]:
        """Per image, class scores [1, K, h, w] at its label map's size, from sliding windows."""
        return self.model.segment(
            batch.image, batch.image_sizes, batch.mask_sizes.sizes, self.window, self.stride, self.window_batch_size
        )

    def update_metrics(
        self, metrics: MetricCollection, output: MaskClassOutput, batch: PanopticImages | SegmentedImages, stage: Stage
    ) -> None:
        if isinstance(batch, SegmentedImages):
            targets = [batch.mask[i, :h, :w] for i, (h, w) in enumerate(batch.mask_sizes.sizes)]
            for scores, target in zip(self.semantic_logits(batch), targets, strict=True):
                metrics["semantic"].update(scores[0].argmax(0)[None], target[None])
            return
        if any(t is None for t in batch.eval_targets):
            raise ConfigError(f"the {stage} split carries no evaluation targets")
        logits = self.per_image(output, batch)
        if "panoptic" in metrics:
            found = [self.panoptic(c, m) for c, m in logits]
            metrics["panoptic"].update(found, batch.eval_targets)
        if "instance" in metrics:
            found = [self.instances(c, m) for c, m in logits]
            things = self.thing_flags(batch.image.device)
            metrics["instance"].update(found, [thing_segments(t, things) for t in batch.eval_targets])
        if "semantic" in metrics:
            for (c, m), truth in zip(logits, batch.eval_targets, strict=True):
                scores = semantic_inference(c, m)
                metrics["semantic"].update(scores.argmax(0)[None], semantic_map(truth, self.ignore_index)[None])

    def thing_flags(self, device: torch.device) -> torch.Tensor:
        """[K] bool, True for thing classes (all of them while `is_thing` is not known)."""
        return torch.tensor(self.is_thing or [True] * self.num_classes, device=device)

    def panoptic(self, class_logits: torch.Tensor, mask_logits: torch.Tensor) -> PanopticSegments:
        """One image's panoptic segments from its class logits [Q, K + 1] and mask logits [Q, H, W]."""
        return panoptic_inference(
            class_logits,
            mask_logits,
            self.thing_flags(class_logits.device),
            self.score_threshold,
            self.overlap_threshold,
        )

    def instances(self, class_logits: torch.Tensor, mask_logits: torch.Tensor) -> InstanceMasks:
        """One image's instances from its class logits [Q, K + 1] and mask logits [Q, H, W]:
        the things among the `top_k` best (query, class) pairs."""
        return instance_inference(class_logits, mask_logits, self.top_k, self.thing_flags(class_logits.device))

    def summarize(self, result: dict[str, Any], stage: Stage) -> dict[str, torch.Tensor]:
        keys = [k for kind in self.evaluate for k in LOGGED[kind]]
        return {f"{stage}/{k}": result[f"{stage}/{k}"] for k in keys if f"{stage}/{k}" in result}

    def format_table(self, result: dict[str, Any], stage: Stage) -> str:
        """The headline figures, then per class PQ (panoptic) or IoU (semantic)."""
        summary = "  ".join(
            f"{k.split('/', 1)[1]} {100 * v.item():.2f}" for k, v in self.summarize(result, stage).items()
        )
        rows = [f"{stage} epoch {self.current_epoch}: {summary}"]
        per_class = {"PQ": f"{stage}/PQ_per_class", "IoU": f"{stage}/IoU"}
        for name, key in per_class.items():
            if key in result:
                rows.append(f"{'class':<24}{name:>8}")
                for cls, value in zip(self.class_names, result[key].tolist(), strict=True):
                    rows.append(f"{cls:<24}{100 * value:8.2f}")
        return "\n".join(rows)

    def draw_batch(self, batch: PanopticImages, pixels: list[np.ndarray], palette: np.ndarray) -> list[np.ndarray]:
        """Per image: its ground-truth segments beside the predicted ones (panoptic or
        instance), each segment in its class colour, at the image's original size; a semantic
        batch's label maps as `SegmentationTask` draws them."""
        if isinstance(batch, SegmentedImages):
            targets = [batch.mask[i, :h, :w] for i, (h, w) in enumerate(batch.mask_sizes.sizes)]
            return [
                draw_segmented(
                    image, t.cpu().numpy(), s[0].argmax(0).cpu().numpy(), palette, self.class_names, self.ignore_index
                )
                for image, t, s in zip(pixels, targets, self.semantic_logits(batch), strict=True)
            ]
        logits = self.per_image(self.forward_batch(batch, "val"), batch)
        pictures = []
        for image, (c, m), truth in zip(pixels, logits, batch.eval_targets, strict=True):
            if self.segmentation == "instance":
                truth = thing_segments(truth, self.thing_flags(c.device))
                found = self.instances(c, m)
                keep = found.scores >= 0.5
                masks, labels = found.masks[keep], found.labels[keep]
            else:
                found = self.panoptic(c, m)
                masks = found.id_map[None] == found.ids[:, None, None]
                labels = found.labels
            pictures.append(
                draw_panoptic(
                    image,
                    (truth.masks.cpu().numpy(), truth.labels.tolist()),
                    (masks.cpu().numpy(), labels.tolist()),
                    palette,
                    self.class_names,
                )
            )
        return pictures

    # ------------------------------------------------------------------ prediction
    def predict_sample(self, image: torch.Tensor, size: Size, index: int) -> PanopticImages | SegmentedImages:
        """No segments; predictions are made at (H0, W0)."""
        if self.segmentation == "semantic":
            return SegmentedImages.unlabeled(image, size, index, self.ignore_index)
        return PanopticImages.unlabeled(image, size, index)

    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        if batch is None:  # every image of the batch was unreadable and skipped (on_bad_sample=skip)
            return None
        if isinstance(batch, SlicedImages):  # large images in tiles (`vitdense.deploy.slicing`; instances only)
            return predict_sliced(self, batch)
        if isinstance(batch, SegmentedImages):
            return SegmentationPrediction(batch.index, [s[0].argmax(0) for s in self.semantic_logits(batch)])
        logits = self.per_image(self(batch.image, batch.image_sizes), batch)
        if self.segmentation == "instance":
            return InstancePrediction(batch.index, [self.instances(c, m) for c, m in logits])
        return PanopticPrediction(batch.index, [self.panoptic(c, m) for c, m in logits])

    def plain_inference(self) -> EoMTInference:
        """`predict_step` without the task: its `segmentation` post-processed with its
        thresholds, `top_k`, things and windows (`vitdense.models`)."""
        return EoMTInference(
            num_classes=self.num_classes,
            window=self.window,
            stride=self.stride,
            segmentation=self.segmentation,
            is_thing=[bool(t) for t in self.is_thing] if self.is_thing is not None else None,
            score_threshold=self.score_threshold,
            overlap_threshold=self.overlap_threshold,
            top_k=self.top_k,
            ignore_index=self.ignore_index,
            window_batch_size=self.window_batch_size,
        )
