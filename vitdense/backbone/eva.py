"""The timm `Eva` family as vitdense encoders: DINOv3, EVA-02, Perception Encoder (PE) and
RoPE-ViT.

They differ from the plain ViT in a few ways, each handled where the plain ViT does the
same job: rotary position embeddings (timm's RoPE modules, asked by `VisionTransformer.
rotary` for each image's own grid, applied to the patch tokens' queries and keys by
`Attention`), EVA's projection layouts and norms (`Attention`'s `qkv_layout`, `qk_norm`,
`scale_norm`), and the block here: SwiGLU or GELU MLPs with an optional inner norm and
LayerScale as timm's Eva names it (`gamma_1`, `gamma_2`). Parameter names are timm's, so
timm's Eva checkpoints (and DINOv3's, EVA's and PE's own, through timm's converter) load
as they are.
"""

from __future__ import annotations

import copy
import functools
import math
from typing import Any, Literal

import torch
from timm.layers import DropPath, GluMlp, Mlp, SwiGLU
from timm.layers import PatchEmbed as TimmPatchEmbed
from timm.models.eva import Eva, EvaAttention
from timm.models.eva import EvaBlock as TimmEvaBlock
from torch import nn

from vitdense.backbone.attention import Attention, AttnImpl, QkvLayout, Window
from vitdense.backbone.vit import PatchEmbed
from vitdense.core.errors import ConfigError

MlpKind = Literal["gelu", "swiglu", "swiglu_packed"]


class EvaBlock(nn.Module):
    """timm's pre-norm `EvaBlock` with vitdense's attention (padding mask, windows, RoPE):
    z' = z + gamma_1 * MSA(LN(z)); z = z' + gamma_2 * MLP(LN(z')).

    Args (beyond `Block`'s):
        mlp: "gelu" (timm `Mlp`), "swiglu" (timm `SwiGLU`: `fc1_g`, `fc1_x`; EVA-02 with
            `scale_mlp`, DINOv3's large models) or "swiglu_packed" (timm `GluMlp`: one
            `fc1` for gate and value; EVA-02 Ti/S).
        mlp_hidden: hidden width of the MLP (per branch for SwiGLU).
        scale_mlp: a LayerNorm inside the MLP, before `fc2` (NormFormer, EVA-02).
        qkv_layout, qk_norm, scale_norm, rotate_half: see `Attention`.
        attn_only_layer_scale: LayerScale on the attention branch only.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        init_values: float | None = None,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        norm_eps: float = 1e-6,
        attn_impl: AttnImpl = "auto",
        mlp: MlpKind = "gelu",
        mlp_hidden: int | None = None,
        scale_mlp: bool = False,
        qkv_layout: QkvLayout = "qv_bias",
        qk_norm: bool = False,
        scale_norm: bool = False,
        rotate_half: bool = False,
        attn_only_layer_scale: bool = False,
    ) -> None:
        super().__init__()
        hidden = mlp_hidden or int(dim * mlp_ratio)
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = Attention(
            dim, num_heads, qkv_bias, attn_drop, proj_drop, attn_impl, qkv_layout, qk_norm, scale_norm, norm_eps,
            rotate_half,
        )  # fmt: skip
        self.init_values = init_values
        self.gamma_1 = nn.Parameter(torch.full((dim,), init_values)) if init_values is not None else None
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        norm = functools.partial(nn.LayerNorm, eps=norm_eps) if scale_mlp else None
        if mlp == "swiglu":
            self.mlp = SwiGLU(dim, hidden, norm_layer=norm, drop=proj_drop)
        elif mlp == "swiglu_packed":
            self.mlp = GluMlp(dim, 2 * hidden, act_layer=nn.SiLU, norm_layer=norm, gate_last=False, drop=proj_drop)
        else:
            self.mlp = Mlp(dim, hidden, act_layer=nn.GELU, norm_layer=norm, drop=proj_drop)
        use_mlp_scale = init_values is not None and not attn_only_layer_scale
        self.gamma_2 = nn.Parameter(torch.full((dim,), init_values)) if use_mlp_scale else None
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def init_weights(self, layer_id: int) -> None:
        """After the encoder's truncated-normal init: EVA's rescaling of the output
        projections by sqrt(2 (layer_id + 1)), LayerScale at `init_values`."""
        with torch.no_grad():
            scale = math.sqrt(2.0 * (layer_id + 1))
            self.attn.proj.weight.div_(scale)
            self.mlp.fc2.weight.div_(scale)
            for gamma in (self.gamma_1, self.gamma_2):
                if gamma is not None:
                    gamma.fill_(self.init_values)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        return_attention: bool = False,
        window: Window | None = None,
        rope: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As `Block.forward`: x [B, T, D] -> ([B, T, D], attention or None)."""
        y, attn = self.attn(self.norm1(x), attn_mask, return_attention, window, rope)
        x = x + self.drop_path1(self.gamma_1 * y if self.gamma_1 is not None else y)
        y = self.mlp(self.norm2(x))
        x = x + self.drop_path2(self.gamma_2 * y if self.gamma_2 is not None else y)
        return x, attn


def _layer_norm_eps(module: nn.Module, what: str, unsupported: list[str]) -> float | None:
    if isinstance(module, nn.LayerNorm):
        return module.eps
    if not isinstance(module, nn.Identity):
        unsupported.append(f"{type(module).__name__} as {what} (LayerNorm only)")
    return None


def rope_module(ref: Eva) -> nn.Module | None:
    """A fresh copy of `ref`'s rotary embedding module, on the CPU with its buffers computed
    and without a fixed feature shape (vitdense asks it for each grid). `ref` must have been
    built with `dynamic_img_size=True` (no cached shape)."""
    if ref.rope is None:
        return None
    rope = copy.deepcopy(ref.rope).to_empty(device="cpu")
    rope.reset_parameters()  # bands / periods / grids recomputed (the learned frequencies: `init_weights`)
    return rope


def eva_arch_from_timm(ref: Eva, model_name: str) -> dict[str, Any]:
    """`VisionTransformer` constructor arguments that reproduce timm's `Eva` model `ref`
    (built on the meta device with `dynamic_img_size=True`).

    Raises ConfigError naming every feature vitdense does not implement (post-norm blocks,
    gated or grouped-query attention, heads of another width, RMSNorm, multimodal RoPE).
    """
    unsupported: list[str] = []
    block = ref.blocks[0]
    if type(block) is not TimmEvaBlock:
        unsupported.append(f"{type(block).__name__} blocks (pre-norm EvaBlock only)")
        raise ConfigError(f"{model_name!r} is outside vitdense's Eva family: {'; '.join(unsupported)}")
    attn = block.attn
    if getattr(attn, "gate", None) is not None:
        unsupported.append("gated attention")
    if any(getattr(b.attn, "num_kv_groups", 1) != 1 for b in ref.blocks):
        unsupported.append("grouped-query attention (num_kv_heads)")
    if attn.head_dim * attn.num_heads != ref.embed_dim:
        unsupported.append(f"attention heads of width {attn.head_dim} (embed_dim / num_heads only)")
    if getattr(ref, "patch_drop", None) is not None:
        unsupported.append("patch dropout (patch_drop_rate)")
    rope_type = type(ref.rope).__name__ if ref.rope is not None else None
    if rope_type not in (None, "RotaryEmbeddingCat", "RotaryEmbeddingDinoV3", "RotaryEmbeddingMixed"):
        unsupported.append(f"{rope_type} rotary embeddings")
    if not isinstance(ref.patch_embed, TimmPatchEmbed) or not isinstance(ref.patch_embed.norm, nn.Identity):
        unsupported.append(f"{type(ref.patch_embed).__name__} patch embedding with a norm")
    norm_eps = _layer_norm_eps(block.norm1, "block norm", unsupported)
    _layer_norm_eps(ref.norm_pre, "pre-encoder norm", unsupported)
    _layer_norm_eps(ref.norm, "final norm", unsupported)
    _layer_norm_eps(attn.q_norm, "query/key norm", unsupported)
    _layer_norm_eps(attn.norm, "attention output norm", unsupported)

    if isinstance(attn, EvaAttention):
        qkv_layout: QkvLayout = "qv_bias" if attn.qkv is not None else "separate"
        qkv_bias = attn.q_bias is not None if attn.qkv is not None else attn.q_proj.bias is not None
    else:  # timm's AttentionRope: one qkv linear with its bias, as the ViT's
        if attn.qkv is None:
            unsupported.append("AttentionRope with separate q/k/v projections")
        qkv_layout = "fused"
        qkv_bias = attn.qkv is not None and attn.qkv.bias is not None
    mlp = block.mlp
    if isinstance(mlp, SwiGLU):
        mlp_kind: MlpKind = "swiglu"
        hidden = mlp.fc1_g.out_features
        if type(mlp.act) is not nn.SiLU:
            unsupported.append(f"SwiGLU with {type(mlp.act).__name__}")
    elif isinstance(mlp, GluMlp):
        mlp_kind, hidden = "swiglu_packed", mlp.fc1.out_features // 2
        if type(mlp.act) is not nn.SiLU or mlp.chunk_dim != -1 or mlp.gate_last:
            unsupported.append("GluMlp other than EVA-02's packed SwiGLU")
    elif type(mlp) is Mlp and type(mlp.act) is nn.GELU and mlp.act.approximate == "none":
        mlp_kind, hidden = "gelu", mlp.fc1.out_features
    else:
        unsupported.append(f"{type(mlp).__name__} MLP with {getattr(mlp, 'act', None)}")
        mlp_kind, hidden = "gelu", 0
    scale_mlp = _layer_norm_eps(mlp.norm, "MLP norm", unsupported) is not None
    if unsupported:
        raise ConfigError(f"{model_name!r} is outside vitdense's Eva family: {'; '.join(unsupported)}")

    embed = ref.patch_embed
    block_args = dict(
        mlp=mlp_kind,
        mlp_hidden=hidden,
        scale_mlp=scale_mlp,
        qkv_layout=qkv_layout,
        qk_norm=not isinstance(attn.q_norm, nn.Identity),
        scale_norm=not isinstance(attn.norm, nn.Identity),
        rotate_half=bool(getattr(attn, "rotate_half", False)),
        attn_only_layer_scale=block.gamma_1 is not None and block.gamma_2 is None,
    )
    return dict(
        img_size=tuple(embed.img_size),
        patch_size=tuple(embed.patch_size),
        in_chans=embed.proj.in_channels,
        embed_dim=ref.embed_dim,
        depth=len(ref.blocks),
        num_heads=attn.num_heads,
        mlp_ratio=hidden / ref.embed_dim,
        qkv_bias=qkv_bias,
        init_values=block.init_values if block.gamma_1 is not None else None,
        class_token=ref.cls_token is not None,
        reg_tokens=ref.reg_token.shape[1] if ref.reg_token is not None else 0,
        no_embed_class=ref.no_embed_class,
        norm_eps=norm_eps,
        patch_embed=PatchEmbed(embed.patch_size, embed.proj.in_channels, ref.embed_dim, embed.proj.bias is not None),
        use_abs_pos_emb=ref.pos_embed is not None,
        rope=rope_module(ref),
        pre_norm=not isinstance(ref.norm_pre, nn.Identity),
        final_norm=not isinstance(ref.norm, nn.Identity),
        block_args=block_args,
    )
