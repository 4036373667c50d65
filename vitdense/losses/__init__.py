"""Detection losses (DETR's Hungarian matcher and set criterion, and the class terms they
share: plain nn.Modules), mask classification's (Mask2Former's point-sampled matcher and set
criterion), segmentation's per-pixel cross-entropy and monocular depth's SILog and MiDaS's
scale- and shift-invariant losses."""

from vitdense.losses.class_losses import ClassLoss, IoUAwareBCELoss, SigmoidFocalLoss, SoftmaxCrossEntropy
from vitdense.losses.depth_losses import ScaleShiftInvariantLoss, SILogLoss, compute_scale_and_shift
from vitdense.losses.mask_criterion import MaskSetCriterion
from vitdense.losses.mask_matcher import MaskHungarianMatcher, point_sample, sample_target_masks, uncertain_point_coords
from vitdense.losses.matcher import HungarianMatcher
from vitdense.losses.pixel_losses import pixel_cross_entropy
from vitdense.losses.set_criterion import SetCriterion

__all__ = [
    "ClassLoss",
    "HungarianMatcher",
    "IoUAwareBCELoss",
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
