"""Detection losses: DETR's Hungarian matcher and set criterion (plain nn.Modules)."""

from vitdense.losses.matcher import HungarianMatcher
from vitdense.losses.set_criterion import SetCriterion

__all__ = ["HungarianMatcher", "SetCriterion"]
