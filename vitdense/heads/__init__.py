"""Task heads: plain `nn.Module`s from `ViTFeatures` to task outputs (they know nothing of Lightning)."""

from vitdense.heads.classification import ClassificationHead

__all__ = ["ClassificationHead"]
