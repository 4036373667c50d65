"""Task heads: plain `nn.Module`s from `ViTFeatures` to task outputs (they know nothing of Lightning)."""

from vitdense.heads.classification import ClassificationHead, DistilledClassificationHead, pool_tokens
from vitdense.heads.detr import DETRHead
from vitdense.heads.dpt import DPTHead
from vitdense.heads.eomt import EoMTHead
from vitdense.heads.keypoints import ConditionalQueryInitializer, KeypointHead, KeypointQueryLayer
from vitdense.heads.linear_probe import LinearProbeHead, probe_features
from vitdense.heads.lwdetr import LWDETRHead
from vitdense.heads.pyramid import MultiLevelProjector, SimpleFeaturePyramid
from vitdense.heads.segmenter import LinearDecoder, MaskTransformerDecoder

__all__ = [
    "ClassificationHead",
    "ConditionalQueryInitializer",
    "DETRHead",
    "DistilledClassificationHead",
    "DPTHead",
    "EoMTHead",
    "KeypointHead",
    "KeypointQueryLayer",
    "LinearDecoder",
    "LinearProbeHead",
    "LWDETRHead",
    "MaskTransformerDecoder",
    "MultiLevelProjector",
    "SimpleFeaturePyramid",
    "pool_tokens",
    "probe_features",
]
