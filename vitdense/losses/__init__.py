"""Detection losses (DETR's Hungarian matcher and set criterion, and the class terms they
share: plain nn.Modules) and segmentation's per-pixel cross-entropy."""

from vitdense.losses.class_losses import ClassLoss, IoUAwareBCELoss, SigmoidFocalLoss, SoftmaxCrossEntropy
from vitdense.losses.matcher import HungarianMatcher
from vitdense.losses.pixel_losses import pixel_cross_entropy
from vitdense.losses.set_criterion import SetCriterion

__all__ = [
    "ClassLoss",
    "HungarianMatcher",
    "IoUAwareBCELoss",
    "SetCriterion",
    "SigmoidFocalLoss",
    "SoftmaxCrossEntropy",
    "pixel_cross_entropy",
]
