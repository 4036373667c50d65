"""Multi-head self-attention of the encoder: key padding masks, ViTDet/RF-DETR windows,
rotary position embeddings on the patch tokens, EVA's projection layouts, and the rule that
picks torch's fused kernel or the explicit softmax (`fused_attention`)."""

from __future__ import annotations

import functools
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from timm.layers import apply_rot_embed_cat
from torch import nn

AttnImpl = Literal["auto", "sdpa", "math"]
QkvLayout = Literal["fused", "qv_bias", "separate"]


def fused_attention(x: torch.Tensor, dropout: float = 0.0) -> bool:
    """Whether attention with queries `x` ([..., T, d]: T queries) and attention dropout
    `dropout` (0 outside training) should take torch's fused `scaled_dot_product_attention`
    rather than an explicit softmax(QK^T)V. The one rule for the backbone's `Attention` and
    the DETR layers; measured per kernel and in `python -m vitdense.bench train-step`
    (README, "Benchmarks"):

    - off CPU: fused.
    - on CPU with attention dropout: explicit. torch has no fused CPU kernel with dropout;
      SDPA falls back to its unfused math path, slower than the explicit one (Segmenter's
      decoder, bf16 on AMX: the whole step 1.2x faster explicit, 1.49 vs 1.23 img/s).
    - fp32 (and fp16): fused.
    - bfloat16 on a CPU with AMX: fused in inference (2-7x faster than explicit) and for
      training sequences over 1024 tokens (equal speed at 1025 with less memory kept,
      1.12x the step at 4097); explicit for shorter ones in training (2x at 197).
    - bfloat16 on a CPU without AMX (AVX512-BF16, or AVX2 emulating it): explicit.

    bfloat16 means the tensor's dtype or, under CPU autocast, the autocast dtype
    (`nn.MultiheadAttention` receives fp32 inputs and computes in bf16)."""
    if x.device.type != "cpu":
        return True
    if dropout > 0:
        return False
    autocast_bf16 = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    if x.dtype != torch.bfloat16 and not autocast_bf16:
        return True
    if not _cpu_has_amx():
        return False
    return not torch.is_grad_enabled() or x.shape[-2] > _EXPLICIT_MAX_TOKENS


# bf16 training with AMX: the longest query sequence that takes the explicit path
_EXPLICIT_MAX_TOKENS = 1024


@functools.cache
def _cpu_has_amx() -> bool:
    """Whether this CPU has AMX tiles (bf16 matrix units); torch's private probe, False if
    this torch has none."""
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(probe and probe())


class Window(NamedTuple):
    """How a windowed block cuts its tokens: the patch grid (h, w), the window size (wh, ww)
    in tokens, and the number of prefix tokens before the patches."""

    grid: tuple[int, int]
    size: tuple[int, int]
    num_prefix: int


class Attention(nn.Module):
    """Multi-head self-attention with a key padding mask and, optionally, rotary position
    embeddings (RoPE) on the patch tokens.

    `attn_impl="auto"` follows `fused_attention` (torch's fused kernel except for some
    bfloat16 cases on CPU); "sdpa" and "math" (explicit) force one.

    The projections take timm's names for each layout (`qkv_layout`): "fused" is the ViT's
    one `qkv` linear layer (also timm's `AttentionRope`); "qv_bias" is EVA's `qkv` without
    bias plus separate `q_bias` and `v_bias` (the key has none); "separate" is EVA's
    `q_proj`, `k_proj` (no bias) and `v_proj`. `qk_norm` normalises queries and keys per
    head, `scale_norm` the attention output before `proj` (EVA-02 CLIP's inner norm).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        attn_impl: AttnImpl = "auto",
        qkv_layout: QkvLayout = "fused",
        qk_norm: bool = False,
        scale_norm: bool = False,
        norm_eps: float = 1e-6,
        rotate_half: bool = False,
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embed_dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.attn_impl = attn_impl
        self.rotate_half = rotate_half
        self.qkv = self.q_proj = self.k_proj = self.v_proj = self.q_bias = self.v_bias = None
        if qkv_layout == "separate":
            self.q_proj = nn.Linear(dim, dim, bias=qkv_bias)
            self.k_proj = nn.Linear(dim, dim, bias=False)
            self.v_proj = nn.Linear(dim, dim, bias=qkv_bias)
        else:
            self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias and qkv_layout == "fused")
            if qkv_bias and qkv_layout == "qv_bias":
                self.q_bias = nn.Parameter(torch.zeros(dim))
                self.v_bias = nn.Parameter(torch.zeros(dim))
                self.register_buffer("k_bias", torch.zeros(dim), persistent=False)
        self.q_norm = nn.LayerNorm(self.head_dim, eps=norm_eps) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim, eps=norm_eps) if qk_norm else nn.Identity()
        self.attn_drop = attn_drop
        self.norm = nn.LayerNorm(dim, eps=norm_eps) if scale_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def _use_sdpa(self, q: torch.Tensor, dropout: float) -> bool:
        if self.attn_impl == "auto":
            return fused_attention(q, dropout)
        return self.attn_impl == "sdpa"

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        return_attention: bool = False,
        window: Window | None = None,
        rope: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: [B, T, D]; attn_mask: [B, 1, 1, T] bool, True where a key may be attended;
        window: attend within windows of the patch grid (see `windowed`); rope: rotary
        embeddings (sin | cos) [B or 1, N, heads or 1, 2 * head_dim] of the last N tokens
        (the patches; the prefix tokens before them are not rotated).

        Returns the output [B, T, D] and, if asked, the attention [B, heads, T, T].
        """
        if window is not None:
            if return_attention:
                raise ValueError("attention maps are returned for global blocks only (global_attn_indexes)")
            x = self.windowed(x, attn_mask, window, rope)
            return self.proj_drop(self.proj(self.norm(x))), None
        b, t, d = x.shape
        q, k, v = self.project_heads(x, rope)
        x, attn = self.attend(q, k, v, attn_mask, return_attention)
        x = self.proj(self.norm(x.transpose(1, 2).reshape(b, t, d)))
        return self.proj_drop(x), attn

    def project(self, x: torch.Tensor, rope: torch.Tensor | None = None) -> torch.Tensor:
        """Queries, keys and values [B, T, 3, heads, head_dim] of tokens x [B, T, D] (the
        windowed path's layout): the projections, then the query/key norms and the rotary
        embedding where configured."""
        qkv = self._qkv(x)
        if rope is None and isinstance(self.q_norm, nn.Identity):
            return qkv
        q, k, v = qkv.unbind(2)
        return torch.stack([*self._norm_rotate(q, k, rope, 1), v], 2)

    def project_heads(
        self, x: torch.Tensor, rope: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`project` in the global path's layout: q, k, v [B, heads, T, head_dim] (rotated in
        that layout, as timm's, with no copy back)."""
        q, k, v = self._qkv(x).permute(2, 0, 3, 1, 4).unbind(0)
        if rope is None and isinstance(self.q_norm, nn.Identity):
            return q, k, v
        q, k = self._norm_rotate(q, k, rope.transpose(1, 2) if rope is not None else None, 2)
        return q, k, v

    def _qkv(self, x: torch.Tensor) -> torch.Tensor:
        """The projections of x [B, T, D] in each layout's own parameters: [B, T, 3, heads, head_dim]."""
        b, t, _ = x.shape
        if self.qkv is None:
            qkv = torch.stack([self.q_proj(x), self.k_proj(x), self.v_proj(x)], 2)
        elif self.q_bias is not None:
            qkv = F.linear(x, self.qkv.weight, torch.cat((self.q_bias, self.k_bias, self.v_bias)))
        else:
            qkv = self.qkv(x)
        return qkv.reshape(b, t, 3, self.num_heads, self.head_dim)

    def _norm_rotate(
        self, q: torch.Tensor, k: torch.Tensor, rope: torch.Tensor | None, token_dim: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = self.rotate(q, rope, token_dim), self.rotate(k, rope, token_dim)
        return q, k

    def rotate(self, x: torch.Tensor, rope: torch.Tensor, token_dim: int = 1) -> torch.Tensor:
        """timm's `apply_rot_embed_cat` on the last N tokens (along `token_dim`) of x
        [B, T, heads, head_dim] or [B, heads, T, head_dim] (N = rope's token count; computed in
        rope's precision, returned in x's dtype)."""
        t, n = x.shape[token_dim], rope.shape[token_dim]
        # (a positive start: a symbolic negative one would fix exported sizes)
        prefix, patches = x.narrow(token_dim, 0, t - n), x.narrow(token_dim, t - n, n)
        return torch.cat([prefix, apply_rot_embed_cat(patches, rope, half=self.rotate_half)], token_dim)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        return_attention: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """softmax(q k^T / sqrt(d)) v over [N, heads, T, d] with a bool key mask broadcastable
        to [N, heads, T_q, T_k] (True: may attend); fused or explicit (`fused_attention`)."""
        drop = self.attn_drop if self.training else 0.0
        if self._use_sdpa(q, drop) and not return_attention:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop), None
        attn = (q * self.scale) @ k.transpose(-2, -1)
        if mask is not None:
            attn = attn.masked_fill(~mask, float("-inf"))
        attn = attn.softmax(dim=-1)
        return (F.dropout(attn, drop) @ v if drop else attn @ v), attn

    def windowed(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None, window: Window, rope: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Window attention (ViTDet / RF-DETR) before the output projection: x [B, P + h*w, D]
        -> [B, P + h*w, D].

        The patch grid (h, w) is padded to whole windows of (wh, ww) tokens (the extra tokens
        are padding, never keys) and each window attends within itself and to the P prefix
        tokens; the prefix tokens attend to every token, as in a global block. Padding
        tokens are never keys; a window with no key at all (only padding, no prefix token)
        attends among its own tokens, whose outputs are padding, so that no NaN appears.
        """
        (h, w), (wh, ww), p = window.grid, window.size, window.num_prefix
        b, t, d = x.shape
        heads, dh = self.num_heads, self.head_dim
        qkv = self.project(x, rope)  # [B, T, 3, heads, dh]
        valid = attn_mask[:, 0, 0, p:].view(b, h, w) if attn_mask is not None else x.new_ones(b, h, w, dtype=torch.bool)
        ph, pw = -h % wh, -w % ww
        grid = F.pad(qkv[:, p:].reshape(b, h, w, 3 * d), (0, 0, 0, pw, 0, ph))
        valid = F.pad(valid, (0, pw, 0, ph), value=False)
        nh, nw = (h + ph) // wh, (w + pw) // ww
        # [B, nh*wh, nw*ww, ...] -> [B * nh * nw, wh * ww, ...]
        windows = grid.view(b, nh, wh, nw, ww, 3, heads, dh).permute(0, 1, 3, 2, 4, 5, 6, 7)
        q, k, v = windows.reshape(b * nh * nw, wh * ww, 3, heads, dh).permute(2, 0, 3, 1, 4).unbind(0)
        keys = valid.view(b, nh, wh, nw, ww).permute(0, 1, 3, 2, 4).reshape(b * nh * nw, wh * ww)
        if p:
            prefix_kv = qkv[:, :p, 1:].repeat_interleave(nh * nw, 0).permute(2, 0, 3, 1, 4)  # [2, B*nW, heads, P, dh]
            k, v = torch.cat([prefix_kv[0], k], 2), torch.cat([prefix_kv[1], v], 2)
            keys = F.pad(keys, (p, 0), value=True)
        keys = keys | ~keys.any(1, keepdim=True)
        # every key valid (no padding anywhere): no mask, so that SDPA may choose a kernel that
        # takes none (flash attention on CUDA)
        unpadded = attn_mask is None and ph == pw == 0
        out, _ = self.attend(q, k, v, None if unpadded else keys[:, None, None, :])  # [B*nW, heads, wh*ww, dh]
        out = out.transpose(1, 2).reshape(b, nh, nw, wh, ww, d).permute(0, 1, 3, 2, 4, 5)
        out = out.reshape(b, nh * wh, nw * ww, d)[:, :h, :w].reshape(b, h * w, d)
        if p:
            q_prefix = qkv[:, :p, 0].transpose(1, 2)  # [B, heads, P, dh]
            k_all, v_all = qkv[:, :, 1].transpose(1, 2), qkv[:, :, 2].transpose(1, 2)
            prefix_out, _ = self.attend(q_prefix, k_all, v_all, attn_mask)
            out = torch.cat([prefix_out.transpose(1, 2).reshape(b, p, d), out], 1)
        return out
