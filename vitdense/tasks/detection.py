"""DETR-style object detection (Carion et al., ECCV 2020) on a ViT's patch tokens.

The backbone encodes each padded batch (padding masked out of attention), a `DETRHead`
decodes object queries into class logits and boxes, a `SetCriterion` matches and scores
them, and COCO's AP is computed by torchmetrics' `MeanAveragePrecision` (`DetectionMeanAP`) on boxes at each
image's original size, against the original annotations (crowds included).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn
from torchmetrics import MetricCollection
from torchvision.ops import box_convert

from vitdense.backbone import VisionTransformer
from vitdense.core.draw import resize
from vitdense.core.errors import ConfigError, NonFiniteError
from vitdense.deploy.slicing import SlicedImages, predict_sliced
from vitdense.heads.detr import DETRHead
from vitdense.losses import SetCriterion
from vitdense.metrics.detection import DetectionMeanAP
from vitdense.metrics.keypoints import KEYPOINT_AP_KEYS, KeypointMeanAP
from vitdense.models.detection import DetectorInference, DETRDetector, Selection
from vitdense.results.detection import DetectionResult
from vitdense.tasks.base import DEFAULT_BACKBONE, BackboneConfig, BaseTask, HeadFactory, Stage
from vitdense.tasks.pictures import draw_detected
from vitdense.training.optim import DEFAULT_LR_SCHEDULER, DEFAULT_OPTIMIZER
from vitdense.types import DetectedImages, DetectionOutput, Detections, KeypointSchema, Losses, Size

#: the loss from the number of classes K: `criterion(num_classes)`; in YAML a class_path
#: (+ init_args, e.g. eos_coef, a matcher), default `SetCriterion` with DETR's settings
CriterionFactory = Callable[[int], nn.Module]

#: the scalars logged per epoch (torchmetrics' names), `{stage}/map` first
MAP_KEYS = (
    "map",
    "map_50",
    "map_75",
    "map_small",
    "map_medium",
    "map_large",
    "mar_1",
    "mar_10",
    "mar_100",
    "mar_small",
    "mar_medium",
    "mar_large",
)


#: the keypoint figures' names beside the box metric's (`{stage}/keypoint_map`, ...)
KEYPOINT_KEYS = tuple(f"keypoint_{k}" for k in KEYPOINT_AP_KEYS)


def map_backend() -> str:
    """torchmetrics' COCO backend: `faster_coco_eval` when installed (same numbers, several
    times faster on large sets), else `pycocotools`."""
    return "faster_coco_eval" if importlib.util.find_spec("faster_coco_eval") else "pycocotools"


class DetectionTask(BaseTask):
    """Object detection with a DETR-family head (DETR's, or LW-DETR / RF-DETR's).

    Logs `{stage}/loss` and every weighted loss term (`loss_ce`, `loss_bbox`, `loss_giou`,
    `loss_ce_0`, ... of the earlier decoder layers, `loss_ce_enc`, ... of two-stage
    proposals; in evaluation each is the split's: the term summed over its images over the
    split's target boxes, DETR's class cross-entropy over its queries' class weights, see
    `SetCriterion`), and per evaluation epoch COCO's
    `{stage}/map`, `map_50`, `map_75`, `map_small/medium/large`, `mar_1/10/100`, with a
    per-class AP table in the log.

    Args:
        num_classes: K object classes, without "no object" (linked from the DataModule).
        class_names: names of the K classes (linked from the DataModule).
        head: `head(embed_dim, num_classes)` -> module from `ViTFeatures` to a
            `DetectionOutput`; None: `DETRHead` with DETR's settings; `LWDETRHead` for
            LW-DETR / RF-DETR's (with a sigmoid `class_loss` in the criterion). (None
            rather than the class as the default: jsonargparse hands a class chosen in YAML
            every argument of the default class's that it also takes, e.g. DETRHead's
            dropout 0.1 to LWDETRHead, whose own default is 0; jsonargparse issue #460.)
        criterion: `criterion(num_classes)` -> module from (output, targets) to `Losses`;
            None: `SetCriterion` with DETR's matcher costs and loss weights.
        selection: how detections are read from the queries: `"per_query"` (DETR's: each
            query's most probable real class, all Q queries kept; AP comparable with DETR's
            tables) or `"top_k"` (the `top_k` best (query, class) pairs per image, as
            Deformable DETR and its successors do). See `postprocess`.
        top_k: detections kept per image with `selection="top_k"`.
        keypoint_schema: with a keypoint head (the head's `num_keypoints` > 0), the objects'
            keypoints as plain data (`KeypointSchema.to_dict()`); None: the DataModule's
            `keypoint_schema`, read at setup and recorded, so checkpoints keep it. With it,
            evaluation also gives COCO's keypoint AP (OKS with the schema's sigmas, as
            COCOeval's iouType="keypoints"): `{stage}/keypoint_map`, `keypoint_map_50`, ...
        (the rest: see `BaseTask`)
    """

    result_type: ClassVar[type] = DetectionResult
    monitor: ClassVar[str] = "val/map"
    mode: ClassVar[Literal["min", "max"]] = "max"
    evaluation_settings: ClassVar[tuple[str, ...]] = (*BaseTask.evaluation_settings, "selection", "top_k")

    def __init__(
        self,
        num_classes: int,
        class_names: list[str] | None = None,
        head: HeadFactory | None = None,
        criterion: CriterionFactory | None = None,
        selection: Selection = "per_query",
        top_k: int = 100,
        keypoint_schema: dict[str, Any] | None = None,
        backbone: BackboneConfig = DEFAULT_BACKBONE,
        optimizer: OptimizerCallable = DEFAULT_OPTIMIZER,
        lr_scheduler: LRSchedulerCallable = DEFAULT_LR_SCHEDULER,
        lr_interval: Literal["step", "epoch"] = "step",
        compile: bool | dict[str, Any] = False,
    ) -> None:
        # read by build_model, which the base calls (the model checks them)
        self._selection, self._top_k = selection, top_k
        self.keypoint_schema = KeypointSchema.from_dict(keypoint_schema) if keypoint_schema else None
        super().__init__(
            num_classes=num_classes,
            head=head or DETRHead,
            class_names=class_names,
            backbone=backbone,
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            lr_interval=lr_interval,
            compile=compile,
        )
        # the criterion shapes training only: a checkpoint restores with the default unless criterion= is given
        self.hparams.pop("criterion", None)
        self.criterion = (criterion or SetCriterion)(num_classes)

    def build_model(self, backbone: VisionTransformer, head: nn.Module) -> DETRDetector:
        return DETRDetector(backbone, head, self._selection, self._top_k)

    @property
    def num_keypoints(self) -> int:
        """K keypoints the head predicts per object (0: none)."""
        return getattr(self.head, "num_keypoints", 0)

    def configure_metrics(self) -> MetricCollection:
        # COCO's evaluation runs on the CPU in fp32 (compute_on_cpu keeps the states there)
        mean_ap = DetectionMeanAP(
            box_format="xyxy", iou_type="bbox", class_metrics=True, backend=map_backend(), compute_on_cpu=True
        )
        metrics = {"map": mean_ap}
        if self.keypoint_schema is not None and self.num_keypoints:
            try:
                metrics["keypoints"] = KeypointMeanAP(
                    self.keypoint_schema.sigmas, key_prefix="keypoint_", compute_on_cpu=True
                )
            except ValueError as err:
                raise ConfigError(f"{err} (data.init_args.keypoint_sigmas)") from None
        return MetricCollection(metrics)

    def setup(self, stage: str) -> None:
        """A keypoint head's schema from the data when the task was not given one (recorded in
        the hyperparameters, so that checkpoints keep it), checked against the head."""
        super().setup(stage)
        if not self.num_keypoints:
            return
        datamodule = getattr(self.trainer, "datamodule", None)
        found = getattr(datamodule, "keypoint_schema", None)
        schema = self.keypoint_schema or found
        if schema is None:
            if stage == "predict":
                return  # predicting needs no schema (names and skeleton only draw and label)
            raise ConfigError(
                f"the head predicts {self.num_keypoints} keypoints per object but the data declares none: train on "
                "keypoint data (COCO person_keypoints JSON, YOLO-pose folders), or set the head's num_keypoints to 0"
            )
        if schema.num_keypoints != self.num_keypoints:
            raise ConfigError(
                f"the head predicts {self.num_keypoints} keypoints per object but the data's objects have "
                f"{schema.num_keypoints} ({', '.join(schema.names)}): set the head's num_keypoints to "
                f"{schema.num_keypoints}"
            )
        if self.keypoint_schema is None:
            self.keypoint_schema = schema
            self.hparams["keypoint_schema"] = schema.to_dict()
            self.build_metrics()

    def forward_batch(self, batch: DetectedImages, stage: Stage) -> DetectionOutput:
        if stage == "train":  # (a head with denoising queries builds them from the targets)
            return self.model(batch.image, batch.image_sizes, targets=batch.targets)
        return self(batch.image, batch.image_sizes)

    def compute_loss(self, output: DetectionOutput, batch: DetectedImages, stage: Stage) -> Losses:
        try:
            return self.criterion(output, batch.targets)
        except NonFiniteError as err:  # the matcher knows the batch position; name the image too
            index = batch.index[err.image] if isinstance(batch.index, torch.Tensor) else batch.index
            raise NonFiniteError(f"{stage} sample {int(index)} of the dataset, {err}", err.image, err.query) from None

    def detections(self, output: DetectionOutput, batch: DetectedImages) -> Detections:
        return self.model.detections(output, batch.orig_sizes, batch.index)

    def update_metrics(
        self, metrics: MetricCollection, output: DetectionOutput, batch: DetectedImages, stage: Stage
    ) -> None:
        if any(t is None for t in batch.eval_targets):
            raise ConfigError(f"the {stage} split carries no evaluation targets (with_eval_targets=False)")
        found = self.detections(output, batch)
        preds = [
            {"boxes": b.cpu(), "scores": s.cpu(), "labels": lab.cpu()}
            for b, s, lab in zip(found.boxes, found.scores, found.labels, strict=True)
        ]
        targets = [
            {
                "boxes": t.boxes.float().cpu(),
                "labels": t.labels.cpu(),
                "iscrowd": t.iscrowd.cpu(),
                "area": t.area.float().cpu(),
            }
            for t in batch.eval_targets
        ]
        metrics["map"].update(preds, targets)
        if "keypoints" in metrics:
            if any(t.keypoints is None for t in batch.eval_targets):
                raise ConfigError(f"the {stage} split's annotations carry no keypoints to evaluate the head's against")
            for pred, target, points, truth in zip(preds, targets, found.keypoints, batch.eval_targets, strict=True):
                pred["keypoints"], target["keypoints"] = points.cpu(), truth.keypoints.float().cpu()
            metrics["keypoints"].update(preds, targets)

    def summarize(self, result: dict[str, Any], stage: Stage) -> dict[str, torch.Tensor]:
        keys = (*MAP_KEYS, *KEYPOINT_KEYS)
        return {f"{stage}/{k}": result[f"{stage}/{k}"] for k in keys if f"{stage}/{k}" in result}

    def format_table(self, result: dict[str, Any], stage: Stage) -> str:
        """COCO's summary line (and its keypoint one) and AP / AR@100 per class (-1: the class
        has no ground truth)."""
        summary = "  ".join(f"{k} {100 * result[f'{stage}/{k}'].item():.2f}" for k in ("map", "map_50", "map_75"))
        rows = [f"{stage} epoch {self.current_epoch}: {summary}"]
        if f"{stage}/keypoint_map" in result:
            keys = ("keypoint_map", "keypoint_map_50", "keypoint_map_75")
            rows.append("keypoints: " + "  ".join(f"{k[9:]} {100 * result[f'{stage}/{k}'].item():.2f}" for k in keys))
        rows.append(f"{'class':<24}{'AP':>8}{'AR@100':>8}")
        classes = result[f"{stage}/classes"].reshape(-1).tolist()
        ap = result[f"{stage}/map_per_class"].reshape(-1).tolist()
        ar = result[f"{stage}/mar_100_per_class"].reshape(-1).tolist()
        for c, a, r in zip(classes, ap, ar, strict=True):
            rows.append(f"{self.class_names[int(c)]:<24}{100 * a:8.2f}{100 * r:8.2f}")
        return "\n".join(rows)

    def draw_batch(self, batch: DetectedImages, pixels: list[np.ndarray], palette: np.ndarray) -> list[np.ndarray]:
        """Per image: its ground-truth boxes beside the predicted ones (with class names and
        scores), at the image's original size."""
        found = self.detections(self.forward_batch(batch, "val"), batch)
        pictures = []
        for i, (image, size) in enumerate(zip(pixels, batch.orig_sizes, strict=True)):
            truth = batch.eval_targets[i] if batch.eval_targets is not None else None
            if truth is not None:  # the original annotations, crowds included
                truth_boxes, truth_labels, truth_keypoints = truth.boxes, truth.labels, truth.keypoints
            else:  # training targets: (cx, cy, w, h) in [0, 1] of the image
                scale = torch.tensor([size[1], size[0], size[1], size[0]], device=batch.targets[i].boxes.device)
                truth_boxes = box_convert(batch.targets[i].boxes, "cxcywh", "xyxy") * scale
                truth_labels = batch.targets[i].labels
                truth_keypoints = batch.targets[i].keypoints
                if truth_keypoints is not None:
                    truth_keypoints = truth_keypoints * torch.cat([scale[:2], scale.new_ones(1)])
            with_keypoints = found.keypoints is not None and truth_keypoints is not None
            pictures.append(
                draw_detected(
                    resize(image, size),
                    truth_boxes.float().cpu().numpy(),
                    truth_labels.tolist(),
                    found.boxes[i].float().cpu().numpy(),
                    found.scores[i].tolist(),
                    found.labels[i].tolist(),
                    palette,
                    self.class_names,
                    truth_keypoints=truth_keypoints.float().cpu().numpy() if with_keypoints else None,
                    keypoints=found.keypoints[i].float().cpu().numpy() if with_keypoints else None,
                    skeleton=self.keypoint_schema.skeleton if self.keypoint_schema is not None else (),
                )
            )
        return pictures

    def predict_sample(self, image: torch.Tensor, size: Size, index: int) -> DetectedImages:
        """No objects; boxes are predicted at (H0, W0)."""
        return DetectedImages.unlabeled(image, size, index)

    def predict_step(self, batch: DetectedImages | SlicedImages | None, batch_idx: int) -> Detections | None:
        if batch is None:  # every image of the batch was unreadable and skipped (on_bad_sample=skip)
            return None
        if isinstance(batch, SlicedImages):  # large images in tiles (`vitdense.deploy.slicing`)
            return predict_sliced(self, batch)
        return self.detections(self.forward_batch(batch, "predict"), batch)

    def plain_inference(self) -> DetectorInference:
        """`predict_step` without the task: the model's detections, read as its `selection`
        and `top_k` say, at each image's size (`vitdense.models`)."""
        return DetectorInference(self.num_classes, self.model.selection, self.model.top_k)
