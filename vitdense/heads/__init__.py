"""Task heads: plain `nn.Module`s from `ViTFeatures` to task outputs (they know nothing of Lightning)."""

from vitdense.heads.classification import ClassificationHead, pool_tokens
from vitdense.heads.linear_probe import LinearProbeHead, probe_features

__all__ = ["ClassificationHead", "LinearProbeHead", "pool_tokens", "probe_features"]
