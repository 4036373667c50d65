"""LightningModules: a backbone, a head, a loss and metrics per task."""

from vitdense.backbone.config import BackboneConfig
from vitdense.tasks.base import BaseTask
from vitdense.tasks.classification import ClassificationTask
from vitdense.tasks.depth import DepthTask
from vitdense.tasks.detection import DetectionTask
from vitdense.tasks.distillation import FeatureDistillationTask
from vitdense.tasks.linear_probe import LinearProbeTask
from vitdense.tasks.multitask import MultiTask
from vitdense.tasks.pretrain import MaskedImageModelingTask
from vitdense.tasks.segmentation import SegmentationTask
from vitdense.tasks.universal import UniversalSegmentationTask

__all__ = [
    "BackboneConfig",
    "BaseTask",
    "ClassificationTask",
    "DepthTask",
    "DetectionTask",
    "FeatureDistillationTask",
    "LinearProbeTask",
    "MaskedImageModelingTask",
    "MultiTask",
    "SegmentationTask",
    "UniversalSegmentationTask",
]
