"""Detection losses (DETR's Hungarian matcher and set criterion, and the class and keypoint
terms they share: plain nn.Modules), mask classification's (Mask2Former's point-sampled matcher and set
criterion), segmentation's per-pixel cross-entropy and monocular depth's SILog and MiDaS's
scale- and shift-invariant losses."""

from vitdense.losses.classification import ClassLoss, IoUAwareBCELoss, SigmoidFocalLoss, SoftmaxCrossEntropy
from vitdense.losses.depth import ScaleShiftInvariantLoss, SILogLoss, compute_scale_and_shift
from vitdense.losses.detection import HungarianMatcher, SetCriterion
from vitdense.losses.keypoints import KeypointLoss
from vitdense.losses.segmentation import pixel_cross_entropy
from vitdense.losses.universal import (
    MaskHungarianMatcher,
    MaskSetCriterion,
    point_sample,
    sample_target_masks,
    uncertain_point_coords,
)

__all__ = [
    "ClassLoss",
    "HungarianMatcher",
    "IoUAwareBCELoss",
    "KeypointLoss",
    "MaskHungarianMatcher",
    "MaskSetCriterion",
    "SILogLoss",
    "ScaleShiftInvariantLoss",
    "SetCriterion",
    "SigmoidFocalLoss",
    "SoftmaxCrossEntropy",
    "compute_scale_and_shift",
    "pixel_cross_entropy",
    "point_sample",
    "sample_target_masks",
    "uncertain_point_coords",
]
