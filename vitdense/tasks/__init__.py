"""LightningModules: a backbone, a head, a loss and metrics per task."""

from vitdense.tasks.base import BaseTask
from vitdense.tasks.classification import ClassificationTask

__all__ = ["BaseTask", "ClassificationTask"]
