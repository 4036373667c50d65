"""Datasets, transforms and DataModules."""

from vitdense.data.synthetic import SyntheticClassificationDataModule, SyntheticShapes
from vitdense.data.types import LabeledImages

__all__ = ["LabeledImages", "SyntheticClassificationDataModule", "SyntheticShapes"]
