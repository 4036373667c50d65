"""The ViT backbone: `create_backbone(name, ...)` -> `VisionTransformer` -> `ViTFeatures`."""

from vitdense.backbone.attention import Attention
from vitdense.backbone.hybrid import HybridEmbed
from vitdense.backbone.pretrained import CheckpointError, create_backbone, load_weights, read_state_dict
from vitdense.backbone.vit import Block, PatchEmbed, VisionTransformer, ViTFeatures

__all__ = [
    "Attention",
    "Block",
    "CheckpointError",
    "HybridEmbed",
    "PatchEmbed",
    "ViTFeatures",
    "VisionTransformer",
    "create_backbone",
    "load_weights",
    "read_state_dict",
]
