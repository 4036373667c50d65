"""EoMT's head ("Your ViT is Secretly an Image Segmentation Model", Kerssies et al., CVPR
2025): learned queries that join the ViT's token sequence for its last blocks, and what
reads masks and classes off them.

The head holds no blocks of its own; `vitdense.models.EoMT` runs the backbone's blocks and
calls the head between them: `predict` (class and mask logits from the normalised tokens)
before each of the last `num_blocks` blocks and after the last, and `attention_mask` (the
queries may attend only the patches inside their previous mask; masked attention) for the
block that follows. Parameter names are EoMT's (`q`, `class_head`, `mask_head.{0,2,4}`,
`upscale.N.{conv1,conv2,norm}`, `attn_mask_probs`), so its weights load by dropping a prefix
(`eomt_state_dict`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import LayerNorm2d
from torch import nn

from vitdense.core.errors import ConfigError
from vitdense.types import ImageSizes

_logger = logging.getLogger(__name__)


class ScaleBlock(nn.Module):
    """Doubles a feature map's resolution: [B, D, h, w] -> [B, D, 2h, 2w] by a 2x2 transposed
    convolution of stride 2, GELU, a depthwise 3x3 convolution and LayerNorm2d (EoMT's; the
    upsampling path of ViTDet's simple feature pyramid)."""

    def __init__(self, embed_dim: int) -> None:
        super().__init__()
        self.conv1 = nn.ConvTranspose2d(embed_dim, embed_dim, kernel_size=2, stride=2)
        self.act = nn.GELU()
        self.conv2 = nn.Conv2d(embed_dim, embed_dim, kernel_size=3, padding=1, groups=embed_dim, bias=False)
        self.norm = LayerNorm2d(embed_dim)

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, D, h, w]; valid: [B, 1, 2h, 2w] bool, False on padding, which is zeroed
        before the 3x3 convolution and after the norm, so that an image's border sees the
        zeros it would see alone (the convolution's own zero padding)."""
        x = self.act(self.conv1(x))
        if valid is not None:
            x = x * valid
        x = self.norm(self.conv2(x))
        return x * valid if valid is not None else x


def num_upscale_blocks(patch_size: int) -> int:
    """ScaleBlocks that bring the patch grid to about 1/4 of the input (EoMT's rule):
    2 for patch 16 (1/4), 1 for patch 14 (1/7) or 8 (1/4)."""
    return max(1, int(math.log2(patch_size)) - 2)


class EoMTHead(nn.Module):
    """EoMT's queries, class head, mask head and upscaling.

    Args:
        embed_dim: D, the backbone's width.
        num_classes: K (the class head has K + 1 outputs, the last "no object").
        patch_size: input pixels per token (the task passes the backbone's); sets the
            number of ScaleBlocks (`num_upscale_blocks`), hence the mask resolution.
        num_queries: Q learned queries (EoMT: 200 for panoptic and instance, 100 for semantic).
        num_blocks: the last blocks the queries join (EoMT: 3 for 12-layer models, 4 for ViT-L).
        masked_attention: restrict each query to its previous mask in those blocks (annealed
            away in training by `attn_mask_probs`); False: plain attention throughout, and
            only the final block's prediction.
    """

    def __init__(
        self,
        embed_dim: int,
        num_classes: int,
        patch_size: int = 16,
        num_queries: int = 100,
        num_blocks: int = 4,
        masked_attention: bool = True,
    ) -> None:
        super().__init__()
        if num_queries < 1 or num_blocks < 1:
            raise ValueError(f"EoMTHead needs num_queries >= 1 and num_blocks >= 1; got {num_queries}, {num_blocks}")
        self.num_queries = num_queries
        self.num_blocks = num_blocks
        self.masked_attention = masked_attention
        self.q = nn.Embedding(num_queries, embed_dim)
        self.class_head = nn.Linear(embed_dim, num_classes + 1)
        self.mask_head = nn.Sequential(
            nn.Linear(embed_dim, embed_dim),
            nn.GELU(),
            nn.Linear(embed_dim, embed_dim),
            nn.GELU(),
            nn.Linear(embed_dim, embed_dim),
        )
        self.upscale = nn.ModuleList(ScaleBlock(embed_dim) for _ in range(num_upscale_blocks(patch_size)))
        #: per joined block, the probability that a query's mask is applied; annealed from 1 to 0
        #: in training (`mask_probability`), kept in checkpoints so that a resumed run continues it
        self.register_buffer("attn_mask_probs", torch.ones(num_blocks))
        self._masks_in_eval = (True,) * num_blocks

    @property
    def mask_stride(self) -> int:
        """Mask logits per token side: 2 ** (number of ScaleBlocks)."""
        return 2 ** len(self.upscale)

    def masks_in_block(self, block: int) -> bool:
        """Whether joined block `block` (0 .. num_blocks - 1) attends through masks: in
        training always (each query's mask then dropped with probability 1 - p, EoMT's
        annealing), in evaluation while its annealing has not finished (p > 0; at p = 0
        EoMT drops every mask, which is no mask; between, where EoMT drops at random, the
        masks apply, so that evaluation is deterministic)."""
        if not self.masked_attention:
            return False
        if self.training:
            return True
        if torch.compiler.is_compiling():  # (export, compile: the buffer's values are not readable while tracing)
            return self._masks_in_eval[block]
        return bool(self.attn_mask_probs[block] > 0)

    def train(self, mode: bool = True) -> EoMTHead:
        super().train(mode)
        if not mode:  # what evaluation traces (`masks_in_block`), read once, eagerly
            self._masks_in_eval = tuple(p > 0 for p in self.attn_mask_probs.tolist())
        return self

    def predict(
        self, x: torch.Tensor, grid: tuple[int, int], num_prefix: int, valid: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Class and mask logits from tokens after the final norm.

        Args:
            x: [B, Q + P + h*w, D]: the queries, the P prefix tokens, the patch grid.
            grid: (h, w).
            num_prefix: P.
            valid: [B, 1, h, w] bool, False on padding tokens (None: no padding).

        Returns:
            class logits [B, Q, K + 1] and mask logits [B, Q, s*h, s*w] (s = `mask_stride`).
        """
        b, _, d = x.shape
        q = x[:, : self.num_queries]
        patches = x[:, self.num_queries + num_prefix :].transpose(1, 2).reshape(b, d, *grid)
        if valid is not None:
            patches = patches * valid
        for block in self.upscale:
            if valid is not None:
                valid = valid.repeat_interleave(2, -2).repeat_interleave(2, -1)
            patches = block(patches, valid)
        mask_logits = torch.einsum("bqc,bchw->bqhw", self.mask_head(q), patches)
        return self.class_head(q), mask_logits

    def attention_mask(
        self,
        mask_logits: torch.Tensor,
        grid: tuple[int, int],
        num_prefix: int,
        keys: torch.Tensor | None,
        block: int,
    ) -> torch.Tensor:
        """The attention mask of joined block `block`: [B, 1, T, T] bool (T = Q + P + h*w),
        True where a query may attend a key.

        Queries attend the prefix tokens, every query and the patches where their previous
        mask logits, resized to the grid (bilinear), are positive; in training each query's
        restriction is lifted with probability 1 - `attn_mask_probs[block]`. Prefix and patch
        tokens attend every token. No token attends padding (`keys`: [B, Q + P + h*w] bool,
        True on tokens that may be attended; None: no padding)."""
        b, num_q = mask_logits.shape[:2]
        t = num_q + num_prefix + grid[0] * grid[1]
        inside = F.interpolate(mask_logits.detach(), grid, mode="bilinear") > 0  # [B, Q, h, w]
        prob = self.attn_mask_probs[block]
        if self.training and prob < 1:  # (no draw at 1: the random stream stays EoMT's)
            lifted = torch.rand(b, num_q, device=mask_logits.device) > prob
            inside = inside | lifted[:, :, None, None]
        mask = torch.ones(b, t, t, dtype=torch.bool, device=mask_logits.device)
        mask[:, :num_q, num_q + num_prefix :] = inside.flatten(2)
        if keys is not None:
            mask = mask & keys[:, None, :]
        return mask[:, None]


def padding_valid(image_sizes: ImageSizes, device: torch.device) -> torch.Tensor | None:
    """[B, 1, h, w] bool, False on padding tokens, from the batch's sizes at the patch
    stride; None when nothing is padded."""
    if not image_sizes.has_padding:
        return None
    return ~image_sizes.mask(device)[:, None]


#: the tensors of EoMT's `EoMT` module that are the head's, by name prefix
_HEAD_TENSORS = ("q.", "class_head.", "mask_head.", "upscale.", "attn_mask_probs")
#: EoMT's pixel normalisation, done by vitdense's transforms instead (ImageNet's mean and std)
_PIXEL_STATS = {"encoder.pixel_mean": IMAGENET_DEFAULT_MEAN, "encoder.pixel_std": IMAGENET_DEFAULT_STD}


def eomt_state_dict(reference: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """vitdense's `EoMT` state dict (`backbone.*`, `head.*`) from EoMT's weights (tue-mps/eomt).

    Takes a Lightning checkpoint of EoMT's training (`{"state_dict": ...}`), its state dict
    (the released `pytorch_model.bin`: `network.encoder.backbone.*`, `network.q.weight`, ...,
    and `criterion.empty_weight`), or the state dict of its `EoMT` module alone
    (`encoder.backbone.*`, `q.weight`, ...). The backbone's tensors are timm's, whose names
    vitdense's backbone shares; the head's names are EoMT's. Dropped, with a count in the
    log: the loss's and other non-network tensors, and `encoder.pixel_mean` / `pixel_std`
    (EoMT normalises pixels inside its model, vitdense in its transforms: with other values
    than ImageNet's, a warning says which to set).

    EoMT's DINOv2 models are timm's `vit_{small,base,large}_patch14_reg4_dinov2` built with
    `patch_size=16` at the training size, e.g. `create_backbone("vit_large_patch14_reg4_dinov2",
    img_size=640, model_args={"patch_size": 16})`; its DINOv3 models (transformers' RoPE
    ViTs) and ViT-g (SwiGLU) are outside vitdense's backbone and refused here.

    Raises:
        ConfigError: a tensor of EoMT's network that vitdense's model has no place for.
    """
    state = reference.get("state_dict", reference)
    lightning = any(key.startswith("network.") for key in state)
    out: dict[str, torch.Tensor] = {}
    dropped = []
    for key, tensor in state.items():
        if lightning and not key.startswith("network."):
            dropped.append(key)  # the loss's "no object" weight, metric states
            continue
        name = key.removeprefix("network.")
        if name in _PIXEL_STATS:
            dropped.append(key)
            expected = torch.tensor(_PIXEL_STATS[name], dtype=torch.float32)
            if not torch.allclose(tensor.float().flatten(), expected, atol=1e-4):
                _logger.warning(
                    "%s is %s, not ImageNet's %s: normalise the images with it (the data's mean/std)",
                    key,
                    tensor.flatten().tolist(),
                    list(_PIXEL_STATS[name]),
                )
        elif name.startswith("encoder.backbone."):
            inner = name.removeprefix("encoder.backbone.")
            if "rope" in inner or ".attention." in inner or inner.startswith("patch_embed.patch_embeddings"):
                raise ConfigError(
                    f"{key}: this EoMT checkpoint's backbone is a transformers ViT with rotary positions (EoMT's "
                    "DINOv3 models); vitdense's VisionTransformer has learned absolute positions: use EoMT's "
                    "DINOv2 checkpoints"
                )
            out[f"backbone.{inner}"] = tensor
        elif name.startswith(_HEAD_TENSORS):
            out[f"head.{name}"] = tensor
        else:
            raise ConfigError(
                f"{key}: not a tensor of EoMT's network (models/eomt.py: encoder.backbone.*, q, class_head, "
                "mask_head, upscale, attn_mask_probs); is this an EoMT checkpoint?"
            )
    if dropped:
        _logger.info("eomt_state_dict: %d tensors outside vitdense's EoMT dropped: %s", len(dropped), dropped)
    return out
