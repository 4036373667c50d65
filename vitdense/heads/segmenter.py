"""Segmenter's decoders (Strudel et al., ICCV 2021, section 3.2): patch tokens -> class masks.

Both map `ViTFeatures` to per-patch class logits [B, K, h, w] on the backbone's grid; the
task upsamples them to pixels and removes the padding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import nn
from torch.utils.checkpoint import checkpoint

from vitdense.backbone import Block, ViTFeatures


def _init_linear_and_norm(module: nn.Module) -> None:
    """Segmenter's initialisation: truncated normal 0.02 for linear layers, unit LayerNorms."""
    if isinstance(module, nn.Linear):
        trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class LinearDecoder(nn.Module):
    """A point-wise linear layer from each patch token to K class logits (Segmenter's
    "linear" decoder, the baseline of Table 3).

    Args:
        embed_dim: D of the backbone.
        num_classes: K.
    """

    def __init__(self, embed_dim: int, num_classes: int) -> None:
        super().__init__()
        self.head = nn.Linear(embed_dim, num_classes)
        self.apply(_init_linear_and_norm)

    def forward(self, features: ViTFeatures) -> torch.Tensor:
        """-> patch-level logits [B, K, h, w]."""
        b, _, _ = features.patch_tokens.shape
        logits = self.head(features.patch_tokens)  # [B, N, K]
        return logits.transpose(1, 2).reshape(b, -1, *features.grid_size)


class MaskTransformerDecoder(nn.Module):
    """Segmenter's mask transformer.

    K learnable class embeddings are appended to the projected patch tokens and processed
    jointly by `depth` transformer blocks; the class masks are the scalar products between
    L2-normalised patch embeddings [B, N, d] and class embeddings [B, K, d], followed by a
    LayerNorm over classes ("mask norm").

    Args:
        embed_dim: D of the backbone.
        num_classes: K.
        depth: transformer blocks (Segmenter: 2).
        decoder_dim: d of the decoder (Segmenter: equal to D).
        num_heads: heads (Segmenter: d / 64); None picks d // 64.
        mlp_ratio: MLP width over d (Segmenter: 4).
        drop_rate: dropout in the blocks (Segmenter: 0.1).
        drop_path_rate: stochastic depth in the blocks (Segmenter: 0).

    `set_grad_checkpointing()` (which the task calls when `backbone.grad_checkpointing` is
    on) recomputes each block in backward. It matters at high resolution: attention dropout
    keeps the attention weights and their dropout mask for backward ([B, heads, N + K,
    N + K]), 2.8 GB for ViT-S's decoder at 1024 x 1024 against 0.25 GB without dropout.
    """

    def __init__(
        self,
        embed_dim: int,
        num_classes: int,
        depth: int = 2,
        decoder_dim: int | None = None,
        num_heads: int | None = None,
        mlp_ratio: float = 4.0,
        drop_rate: float = 0.1,
        drop_path_rate: float = 0.0,
    ) -> None:
        super().__init__()
        dim = decoder_dim or embed_dim
        heads = num_heads or max(1, dim // 64)
        self.num_classes = num_classes
        self.proj_dec = nn.Linear(embed_dim, dim)
        rates = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]
        self.blocks = nn.ModuleList(
            Block(dim, heads, mlp_ratio, proj_drop=drop_rate, attn_drop=drop_rate, drop_path=rate, norm_eps=1e-5)
            for rate in rates
        )
        self.cls_emb = nn.Parameter(torch.zeros(1, num_classes, dim))
        scale = dim**-0.5
        self.proj_patch = nn.Parameter(scale * torch.randn(dim, dim))
        self.proj_classes = nn.Parameter(scale * torch.randn(dim, dim))
        self.decoder_norm = nn.LayerNorm(dim)
        self.mask_norm = nn.LayerNorm(num_classes)
        self.apply(_init_linear_and_norm)
        trunc_normal_(self.cls_emb, std=0.02)
        self.grad_checkpointing = False

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block in backward instead of storing its activations (the same
        dropout draws: torch's checkpoint restores the RNG state)."""
        self.grad_checkpointing = enable

    def forward(self, features: ViTFeatures) -> torch.Tensor:
        """-> patch-level mask logits [B, K, h, w]."""
        patches = self.proj_dec(features.patch_tokens)  # [B, N, d]
        b, n, _ = patches.shape
        x = torch.cat([patches, self.cls_emb.expand(b, -1, -1)], dim=1)  # [B, N + K, d]
        attn_mask = None
        padding = features.padding()
        if padding is not None:
            # padding patches are no keys; class embeddings always are
            attn_mask = F.pad(~padding, (0, self.num_classes), value=True)[:, None, None, :]
        for block in self.blocks:
            if self.grad_checkpointing and torch.is_grad_enabled():
                x, _ = checkpoint(block, x, attn_mask, use_reentrant=False)
            else:
                x, _ = block(x, attn_mask)
        x = self.decoder_norm(x)
        patches = F.normalize(x[:, :n] @ self.proj_patch, dim=-1)
        classes = F.normalize(x[:, n:] @ self.proj_classes, dim=-1)
        masks = self.mask_norm(patches @ classes.transpose(1, 2))  # [B, N, K]
        return masks.transpose(1, 2).reshape(b, self.num_classes, *features.grid_size)
