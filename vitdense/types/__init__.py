"""The contract types every part of vitdense passes around: batches, task outputs,
predictions and losses. NamedTuples (Lightning moves their tensors between devices as
they are), importable without importing any dataset family, transform library or task.

Batches come from one padding collate (`vitdense.types.collate.pad_collate`): images are
zero-padded right and bottom to the batch's largest size, and the batch's `ImageSizes`
says which part of each image is real. That one object travels unchanged from the collate
through the backbone (as `ViTFeatures.image_sizes`, at the patch stride) to the heads and
post-processing; every pixel mask, token mask or valid ratio is derived from it, at any
stride, and nothing re-derives sizes from a mask.


One module per family (`vitdense.types.detection`, `.segmentation`, …), the shared sizes and
losses in `vitdense.types.common`; every name is importable from `vitdense.types` itself.
"""

from vitdense.types.classification import ClassificationOutput, ClassPrediction, LabeledImages
from vitdense.types.common import ImageSizes, Losses, LossSum, SameSize, Size
from vitdense.types.depth import DepthImages, DepthOutput, DepthPrediction
from vitdense.types.detection import BoxTargets, Denoising, DetectedImages, DetectionOutput, Detections, EvalTargets
from vitdense.types.keypoints import COCO_PERSON, KeypointSchema
from vitdense.types.segmentation import SegmentationOutput, SegmentationPrediction, SegmentedImages
from vitdense.types.universal import (
    InstanceMasks,
    InstancePrediction,
    MaskClassOutput,
    PanopticImages,
    PanopticPrediction,
    PanopticSegments,
    SegmentTargets,
)

__all__ = [
    "COCO_PERSON",
    "BoxTargets",
    "ClassPrediction",
    "ClassificationOutput",
    "Denoising",
    "DepthImages",
    "DepthOutput",
    "DepthPrediction",
    "DetectedImages",
    "DetectionOutput",
    "Detections",
    "EvalTargets",
    "ImageSizes",
    "InstanceMasks",
    "InstancePrediction",
    "KeypointSchema",
    "LabeledImages",
    "LossSum",
    "Losses",
    "MaskClassOutput",
    "PanopticImages",
    "PanopticPrediction",
    "PanopticSegments",
    "SameSize",
    "SegmentTargets",
    "SegmentationOutput",
    "SegmentationPrediction",
    "SegmentedImages",
    "Size",
]
