"""`BackboneConfig`: how a task builds and trains its encoder (one YAML block, shared by every task)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vitdense.backbone.pretrained import create_backbone
from vitdense.backbone.vit import VisionTransformer
from vitdense.core.errors import ConfigError


@dataclass(frozen=True)
class BackboneConfig:
    """How a task builds and trains its encoder (YAML: `model.init_args.backbone`).

    Attributes:
        name: timm model name, optionally with a pretrained tag
            ("vit_base_patch16_224.augreg_in21k").
        pretrained: load the tag's weights from timm's hub (online).
        checkpoint: load the encoder from a local file instead (timm format or JAX .npz).
        trust_checkpoint: `checkpoint` is a file you trust: load it in full even if it holds
            Python objects beyond tensors and plain values (unpickling such a file may run
            any code). Off: such a file is refused, naming this key; official checkpoints
            (DeiT's and MAE's `args` Namespace, numpy scalars) load without it.
        img_size: native input size; position embeddings are resampled to it on loading.
        drop_path_rate: stochastic depth.
        freeze: give the encoder no gradients (train the head only).
        freeze_blocks: freeze the embeddings and the first k blocks.
        grad_checkpointing: recompute activations in backward to save memory.
        lr_scale: learning-rate multiplier of the whole encoder.
        layer_decay: layer-wise learning-rate decay (1 = off).
        model_args: timm architecture overrides for a model trained from scratch, e.g.
            `{depth: 6, patch_size: 8}` (timm's `create_model` keyword arguments).
    """

    name: str = "vit_tiny_patch16_224"
    pretrained: bool = False
    checkpoint: str | None = None
    trust_checkpoint: bool = False
    img_size: int | None = None
    drop_path_rate: float = 0.0
    freeze: bool = False
    freeze_blocks: int = 0
    grad_checkpointing: bool = False
    lr_scale: float = 1.0
    layer_decay: float = 1.0
    model_args: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.pretrained and self.checkpoint is not None:
            # a task would load the file, then replace it with the hub's weights in setup
            raise ConfigError(
                f"model.init_args.backbone: pretrained=true and checkpoint={self.checkpoint} both given; to start "
                "from the file, set pretrained: false (--model.init_args.backbone.pretrained=false)"
            )

    @property
    def starts_pretrained(self) -> bool:
        """Training starts from trained weights (the hub's or a checkpoint file's), not from
        a random initialisation: what the paper's zero-initialised head assumes."""
        return self.pretrained or self.checkpoint is not None

    def build(self, load_pretrained: bool = True) -> VisionTransformer:
        """The encoder; with `load_pretrained=False` a `pretrained` one is left at its random
        initialisation (tasks load the weights later, once per node: `vitdense.tasks.pretrained`)."""
        backbone = create_backbone(
            self.name,
            self.pretrained and load_pretrained,
            self.checkpoint,
            self.img_size,
            drop_path_rate=self.drop_path_rate,
            model_args=self.model_args,
            trust_checkpoint=self.trust_checkpoint,
        )
        backbone.set_grad_checkpointing(self.grad_checkpointing)
        if self.freeze:
            backbone.freeze()
        elif self.freeze_blocks:
            backbone.freeze(self.freeze_blocks)
        return backbone

    def hub_weights(self, img_size: tuple[int, int]) -> VisionTransformer:
        """The encoder with the tag's hub weights at `img_size` (downloaded into timm's cache
        the first time): what `pretrained` loads."""
        return create_backbone(self.name, pretrained=True, img_size=img_size, model_args=self.model_args)


DEFAULT_BACKBONE = BackboneConfig()
# checkpoints carry it in their hyperparameters, so torch.load(weights_only=True) must accept it,
# also under the name checkpoints written before it moved here recorded
torch.serialization.add_safe_globals([BackboneConfig, (BackboneConfig, "vitdense.tasks.base.BackboneConfig")])
