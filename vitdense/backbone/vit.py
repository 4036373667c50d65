"""The Vision Transformer encoder of "An Image is Worth 16x16 Words" (Dosovitskiy et al.).

Parameter names follow timm's state dicts (`patch_embed.proj`, `cls_token`, `pos_embed`,
`blocks.N.attn.qkv`, `norm`), so a timm checkpoint loads without renaming. Unlike timm's
model, the encoder takes images of any size in one batch: the batch's `ImageSizes` says
where each image ends, every image gets position embeddings resampled to its own patch
grid, and attention ignores padding tokens, so an image's features do not depend on its
batch-mates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from timm.layers import DropPath, LayerScale, Mlp, to_2tuple, trunc_normal_
from timm.layers.pos_embed_sincos import init_random_2d_freqs
from timm.models._features import feature_take_indices
from torch import nn
from torch.utils.checkpoint import checkpoint

from vitdense.backbone.attention import Attention, AttnImpl, Window
from vitdense.backbone.one_pass import EncodedBatch, EncoderRequest, OnePass
from vitdense.backbone.pos_embed import GridSize, PosEmbed
from vitdense.backbone.rope import grid_rotary
from vitdense.types import ImageSizes
from vitdense.types.common import _ceil_div


class ViTFeatures(NamedTuple):
    """What the backbone hands to every head.

    Attributes:
        cls_token: [B, D] class token after the final norm; None for models without one.
        patch_tokens: [B, N, D] patch tokens after the final norm, row-major over
            `grid_size` (N = h * w). Padding tokens are zero.
        grid_size: (h, w) patch grid of the (padded) batch.
        image_sizes: the batch's `ImageSizes` at the patch stride (`grid_size` is its
            `grid`); heads derive token masks and valid ratios from it.
        prefix_tokens: [B, P, D] all prefix tokens after the final norm, in order class,
            distillation, registers (P may be 0).
        intermediates: [B, P + N, D] outputs of the requested blocks, in the order
            requested: raw (before the final norm) unless asked for normalised.
        attentions: [B, num_heads, P + N, P + N] softmax attention of the requested blocks.
        stem_features: [B, C_s, H / s, W / s] outputs of the requested hybrid CNN stages.
    """

    cls_token: torch.Tensor | None
    patch_tokens: torch.Tensor
    grid_size: GridSize
    image_sizes: ImageSizes
    prefix_tokens: torch.Tensor
    intermediates: tuple[torch.Tensor, ...] = ()
    attentions: tuple[torch.Tensor, ...] = ()
    stem_features: tuple[torch.Tensor, ...] = ()

    def spatial(self) -> torch.Tensor:
        """Patch tokens as a feature map: [B, D, h, w]."""
        b, _, d = self.patch_tokens.shape
        return self.patch_tokens.transpose(1, 2).reshape(b, d, *self.grid_size)

    def padding(self) -> torch.Tensor | None:
        """[B, N] bool, True on patch tokens that cover only padding; None without any."""
        if not self.image_sizes.has_padding:
            return None
        return self.image_sizes.mask(self.patch_tokens.device).flatten(1)


class PatchEmbed(nn.Module):
    """Non-overlapping P x P patches, linearly projected: a convolution with stride P.

    Inputs whose sides are not multiples of P are zero-padded right and bottom (as timm's
    `dynamic_img_pad`), so the last row/column of tokens covers part image, part padding.
    """

    def __init__(
        self, patch_size: int | tuple[int, int] = 16, in_chans: int = 3, embed_dim: int = 768, bias: bool = True
    ) -> None:
        super().__init__()
        self.patch_size: tuple[int, int] = to_2tuple(patch_size)
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size, bias=bias)

    @property
    def reduction(self) -> tuple[int, int]:
        """Input pixels per token along (h, w)."""
        return self.patch_size

    def grid_for(self, height: int, width: int) -> GridSize:
        """Token grid of an image of this size."""
        return -(-height // self.patch_size[0]), -(-width // self.patch_size[1])  # ceil, also for symbolic sizes

    def forward(self, x: torch.Tensor, image_sizes: ImageSizes | None = None) -> torch.Tensor:
        """[B, C, H, W] -> [B, h, w, D]. Needs no `image_sizes`: the batch's zero padding is
        what an image alone is padded with to a multiple of P."""
        ph, pw = self.patch_size
        pad_h, pad_w = -x.shape[-2] % ph, -x.shape[-1] % pw
        if torch.compiler.is_exporting() or pad_h or pad_w:  # (exported: pads any size, not only the example's)
            x = F.pad(x, (0, pad_w, 0, pad_h))
        return self.proj(x).permute(0, 2, 3, 1)


class Block(nn.Module):
    """Pre-norm encoder block: z' = z + MSA(LN(z)); z = z' + MLP(LN(z')) (paper eq. 2-3).

    With `init_values`, each residual branch is scaled by a learned per-channel LayerScale
    (CaiT/DeiT-III); with `drop_path`, it is dropped per sample (stochastic depth).
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
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = Attention(dim, num_heads, qkv_bias, attn_drop, proj_drop, attn_impl)
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU, drop=proj_drop)
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        return_attention: bool = False,
        window: Window | None = None,
        rope: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: [B, T, D] -> ([B, T, D], attention [B, heads, T, T] or None); with `window`,
        the attention is windowed (`Attention.windowed`); `rope`: see `Attention.forward`."""
        y, attn = self.attn(self.norm1(x), attn_mask, return_attention, window, rope)
        x = x + self.drop_path1(self.ls1(y))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x, attn


class VisionTransformer(nn.Module):
    """ViT encoder producing `ViTFeatures` (class token, patch tokens, grid) at any input size.

    Args:
        img_size: native input size; fixes the grid the position table is stored at.
        patch_size: P of the P x P patches (1 for hybrids, which patchify a CNN feature map).
        in_chans: input channels.
        embed_dim, depth, num_heads, mlp_ratio, qkv_bias: the encoder's shape (paper Table 1).
        init_values: LayerScale initial value; None disables LayerScale.
        class_token: prepend a learnable class token (False for global-average-pool models).
        dist_token: prepend a DeiT distillation token after the class token.
        reg_tokens: number of register tokens (Darcet et al.) after the class token.
        no_embed_class: position embeddings cover only the patches (DeiT-III, big_vision);
            otherwise the table has an entry per prefix token too (original ViT, DeiT).
        drop_rate: dropout after adding position embeddings and after every dense layer
            except the qkv projection (paper appendix B.1).
        attn_drop_rate: dropout on the attention weights.
        drop_path_rate: stochastic depth, increasing linearly from 0 to this over the blocks.
        norm_eps: LayerNorm epsilon (timm and the JAX code use 1e-6).
        attn_impl: "auto", "sdpa" (fused) or "math" (explicit softmax).
        patch_embed: a replacement patch embedding, e.g. `HybridEmbed` (ResNet stem); it must
            map ([B, C, H, W], `ImageSizes`) to [B, h, w, embed_dim] and offer `reduction`
            and `grid_for`.
        window_size: windowed attention as ViTDet's: every block not in
            `global_attn_indexes` attends within windows of window_size x window_size
            tokens tiled from the top-left (`Attention.windowed`), so that memory grows with
            the image, not with its square. The windows of an image are the same alone and
            padded into a batch: detections do not depend on the batch.
        num_windows: windowed attention as RF-DETR's: the (padded) grid cut into
            num_windows x num_windows windows. Their size follows the batch's padded grid, so
            a padded image's windows depend on its batch (RF-DETR resizes every image to one
            square, so never pads); prefer `window_size` with mixed sizes.
        global_attn_indexes: blocks that attend globally (ViTDet ViT-B: 2, 5, 8, 11).
            No new parameters either way: timm's weights load unchanged.
        use_abs_pos_emb: a learned absolute position table (`pos_embed`); False for
            encoders with rotary embeddings only (DINOv3, RoPE-ViT).
        rope: rotary position embeddings: one of timm's RoPE modules built without a fixed
            feature shape (`RotaryEmbeddingCat` for EVA-02, PE and RoPE-ViT axial,
            `RotaryEmbeddingDinoV3`, `RotaryEmbeddingMixed`), asked for each image's own grid
            (`rotary`). Its training-time coordinate augmentation (shift, jitter, rescale)
            applies in training mode, one draw per distinct grid in a batch.
        pre_norm: a LayerNorm before the blocks (`norm_pre`; CLIP, PE).
        final_norm: the LayerNorm after the blocks (`norm`); False where timm normalises
            only after pooling (EVA-02's `fc_norm`, a classification-head part here).
        block_fn: the block class, called with `Block`'s arguments (`EvaBlock` with its
            MLP and attention options bound, for the timm `Eva` family).
    """

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = 16,
        in_chans: int = 3,
        embed_dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        init_values: float | None = None,
        class_token: bool = True,
        dist_token: bool = False,
        reg_tokens: int = 0,
        no_embed_class: bool = False,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        norm_eps: float = 1e-6,
        attn_impl: AttnImpl = "auto",
        patch_embed: nn.Module | None = None,
        window_size: int | None = None,
        num_windows: int | None = None,
        global_attn_indexes: Sequence[int] = (),
        use_abs_pos_emb: bool = True,
        rope: nn.Module | None = None,
        pre_norm: bool = False,
        final_norm: bool = True,
        block_fn: Callable[..., nn.Module] = Block,
    ) -> None:
        super().__init__()
        if window_size is not None and num_windows is not None:
            raise ValueError("give window_size (ViTDet's, in tokens) or num_windows (RF-DETR's, per side), not both")
        if (window_size is not None and window_size < 1) or (num_windows is not None and num_windows < 1):
            raise ValueError(f"window_size={window_size}, num_windows={num_windows}: expected at least 1")
        if bad := [i for i in global_attn_indexes if not -depth <= i < depth]:
            raise ValueError(f"global_attn_indexes {bad} are out of range for depth {depth}")
        self.window_size = window_size
        self.num_windows = num_windows
        self.global_attn_indexes = tuple(i % depth for i in global_attn_indexes)
        self.img_size: tuple[int, int] = to_2tuple(img_size)
        self.in_chans = in_chans
        self.embed_dim = self.num_features = embed_dim
        self.depth = depth
        self.num_heads = num_heads
        self.no_embed_class = no_embed_class
        self.patch_embed = patch_embed or PatchEmbed(patch_size, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if dist_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, reg_tokens, embed_dim)) if reg_tokens else None
        self.num_prefix_tokens = int(class_token) + int(dist_token) + reg_tokens
        native_grid = self.patch_embed.grid_for(*self.img_size)
        table_prefix = 0 if no_embed_class else self.num_prefix_tokens
        table_size = table_prefix + native_grid[0] * native_grid[1]
        self.pos_embed = nn.Parameter(torch.zeros(1, table_size, embed_dim)) if use_abs_pos_emb else None
        self.pos_embed_resampler = PosEmbed(native_grid, table_prefix)
        self.pos_drop = nn.Dropout(drop_rate)
        self.rope = rope
        self.norm_pre = nn.LayerNorm(embed_dim, eps=norm_eps) if pre_norm else nn.Identity()
        # stochastic depth rising linearly over depth (plain floats: works on the meta device)
        dpr = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]
        self.blocks = nn.ModuleList(
            block_fn(
                embed_dim,
                num_heads,
                mlp_ratio,
                qkv_bias,
                init_values,
                proj_drop=drop_rate,
                attn_drop=attn_drop_rate,
                drop_path=rate,
                norm_eps=norm_eps,
                attn_impl=attn_impl,
            )
            for rate in dpr
        )
        self.norm = nn.LayerNorm(embed_dim, eps=norm_eps) if final_norm else nn.Identity()
        self.grad_checkpointing = False
        #: the open `one_pass` block's passes (None: every call encodes)
        self._one_pass: OnePass | None = None
        #: timm's pretrained config (mean, std, input size, ...); `create_backbone` fills it in
        self.pretrained_cfg: dict = {}
        self.init_weights()

    # ----------------------------------------------------------------------------- setup
    def init_weights(self) -> None:
        """timm's default ViT initialisation (truncated normal 0.02, zero biases); blocks
        with their own `init_weights` (EVA's depth-scaled projections) finish their own."""
        if self.pos_embed is not None:
            trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        for token in (self.dist_token, self.reg_token):
            if token is not None:
                trunc_normal_(token, std=0.02)
        for module in self.blocks.modules():
            if isinstance(module, nn.Linear):
                trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for i, block in enumerate(self.blocks):
            if hasattr(block, "init_weights"):
                block.init_weights(i)
        if self.rope is not None and isinstance(getattr(self.rope, "freqs", None), nn.Parameter):
            # RoPE-Mixed's learned frequencies start as timm draws them (random directions per head)
            with torch.no_grad():
                self.rope.freqs.copy_(
                    init_random_2d_freqs(
                        self.embed_dim // self.num_heads, self.depth, self.num_heads, temperature=self.rope.temperature
                    )
                )

    @property
    def patch_size(self) -> tuple[int, int]:
        """Input pixels per token (the hybrid's stride times its patch size)."""
        return self.patch_embed.reduction

    @property
    def grid_size(self) -> GridSize:
        """Native token grid, for `img_size`."""
        return self.pos_embed_resampler.native_grid

    def window_for(self, grid: GridSize) -> Window | None:
        """The windows of a batch's patch grid, or None where one window would cover it all
        (windowed blocks are then global blocks: the same computation)."""
        if self.window_size is not None:
            size = (self.window_size, self.window_size)
        elif self.num_windows is not None:
            size = (_ceil_div(grid[0], self.num_windows), _ceil_div(grid[1], self.num_windows))
        else:
            return None
        if size[0] >= grid[0] and size[1] >= grid[1]:
            return None
        return Window((grid[0], grid[1]), size, self.num_prefix_tokens)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block (and the hybrid CNN's stages) in backward instead of storing
        their activations."""
        self.grad_checkpointing = enable
        if hasattr(self.patch_embed, "set_grad_checkpointing"):
            self.patch_embed.set_grad_checkpointing(enable)

    def freeze(self, num_blocks: int | None = None) -> None:
        """Stop gradients to the whole encoder (None) or to the embeddings and first k blocks."""
        if num_blocks is None:
            self.requires_grad_(False)
            return
        if not 0 <= num_blocks <= self.depth:
            raise ValueError(f"freeze(num_blocks={num_blocks}): must be between 0 and depth={self.depth}")
        for name, param in self.named_parameters():
            if self.layer_id(name) <= num_blocks:
                param.requires_grad_(False)

    def layer_id(self, param_name: str) -> int:
        """Depth of a parameter for layer-wise learning-rate decay.

        0 for the embeddings and prefix tokens, i + 1 for `blocks.i`, depth + 1 for the
        final norm; `num_layers` is depth + 2.
        """
        if param_name.startswith("blocks."):
            return int(param_name.split(".")[1]) + 1
        if param_name.startswith("norm."):
            return self.depth + 1
        return 0

    @property
    def num_layers(self) -> int:
        return self.depth + 2

    def no_weight_decay(self) -> set[str]:
        """Names of the parameters trained without weight decay: position embeddings,
        prefix tokens, learned rotary frequencies, every norm weight, every bias (all
        parameters with ndim <= 1)."""
        tokens = {"pos_embed", "cls_token", "dist_token", "reg_token"}
        return {n for n, p in self.named_parameters() if n in tokens or n.startswith("rope.") or p.ndim <= 1}

    # --------------------------------------------------------------------------- forward
    # forward = embed -> add_pos_embed -> forward_tokens, each public so that pre-training
    # objectives (vitdense.pretrain) can corrupt or drop tokens in between
    def embed(self, x: torch.Tensor, image_sizes: ImageSizes | None = None) -> tuple[torch.Tensor, ImageSizes]:
        """Patch embeddings [B, h, w, D] of images [B, C, H, W] (padded as `image_sizes`
        says; None: none is), before position embeddings, and the batch's sizes at the patch
        stride."""
        b, _, height, width = x.shape
        if image_sizes is None:
            image_sizes = ImageSizes.full(b, (height, width))
        elif image_sizes.batch != b or tuple(image_sizes.padded) != (height, width):
            raise ValueError(
                f"image_sizes describe {image_sizes.batch} images padded to {tuple(image_sizes.padded)}, "
                f"but the batch is {b} images of {height} x {width}"
            )
        return self.patch_embed(x, image_sizes), image_sizes.at_stride(self.patch_size)

    def add_pos_embed(self, x: torch.Tensor, image_sizes: ImageSizes) -> torch.Tensor:
        """Add position embeddings and prepend prefix tokens.

        x: [B, h, w, D] patch embeddings; image_sizes at the patch stride. Returns
        [B, P + h*w, D]: each image gets the table resampled to its own grid, zero on its
        padding (no table: the tokens as they are; rotary embeddings come with `rotary`),
        then the pre-encoder norm where there is one.
        """
        b, h, w, d = x.shape
        prefix = [t.expand(b, -1, -1) for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        if self.pos_embed is None:
            return self.norm_pre(self.pos_drop(torch.cat([*prefix, x.reshape(b, h * w, d)], dim=1)))
        p = self.pos_embed_resampler.num_prefix_tokens
        if not image_sizes.has_padding:
            table = self.pos_embed_resampler.resample(self.pos_embed, (h, w))
            prefix_pos, patch_pos = table[:, :p], table[:, p:]
        else:
            tables = {}
            for g in dict.fromkeys(image_sizes.grids):
                table = self.pos_embed_resampler.resample(self.pos_embed, g)
                prefix_pos = table[:, :p]
                patch = table[:, p:].reshape(1, g[0], g[1], d)
                tables[g] = F.pad(patch, (0, 0, 0, w - g[1], 0, h - g[0]))
            patch_pos = torch.cat([tables[g] for g in image_sizes.grids]).reshape(b, h * w, d)
        x = x.reshape(b, h * w, d)
        if self.no_embed_class:
            x = torch.cat([*prefix, x + patch_pos], dim=1)
        else:
            pos = torch.cat([prefix_pos.expand(patch_pos.shape[0], -1, -1), patch_pos], 1) if p else patch_pos
            x = torch.cat([*prefix, x], dim=1) + pos
        return self.norm_pre(self.pos_drop(x))

    def rotary(self, image_sizes: ImageSizes, device: torch.device | None = None) -> torch.Tensor | None:
        """Rotary embeddings (sin | cos) of the batch's patch tokens for `forward_tokens`:
        [L, B or 1, h*w, heads or 1, 2 * head_dim], L = depth for RoPE-Mixed (a set per
        block), else 1; None without RoPE. image_sizes at the patch stride.

        Each image takes the coordinates of its own grid (DINOv3: centred and normalised
        over the image's h_i x w_i, not over the padded canvas; EVA-02: indices rescaled to
        the reference grid), laid out top-left on the batch's grid; padding tokens get
        zeros (they are never attended).
        """
        if self.rope is None:
            return None
        h, w = image_sizes.grid
        if not image_sizes.has_padding:  # (also the exported graph's path: symbolic sizes are not hashed)
            return grid_rotary(self.rope, (h, w))[:, None].to(device)
        embeds = {}
        for g in dict.fromkeys(image_sizes.grids):
            grid = grid_rotary(self.rope, g).unflatten(1, g)  # [L, g0, g1, heads|1, 2dh]
            embeds[g] = F.pad(grid, (0, 0, 0, 0, 0, w - g[1], 0, h - g[0])).flatten(1, 2)
        return torch.stack([embeds[g] for g in image_sizes.grids], 1).to(device)  # [L, B, h*w, heads|1, 2dh]

    def key_mask(self, image_sizes: ImageSizes, device: torch.device | None = None) -> torch.Tensor | None:
        """[B, P + N] bool, True on the tokens attention may look at (every prefix token,
        the patches of each image), for `forward_tokens`; None when nothing is padded."""
        if not image_sizes.has_padding:
            return None
        keep = ~image_sizes.mask(device).flatten(1)  # [B, N]: padding tokens are no keys
        return F.pad(keep, (self.num_prefix_tokens, 0), value=True)

    def forward_tokens(
        self,
        x: torch.Tensor,
        keys: torch.Tensor | None = None,
        grid: GridSize | None = None,
        intermediates: Sequence[int] = (),
        attentions: Sequence[int] = (),
        rope: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """The blocks and the final norm over a token sequence.

        Args:
            x: [B, T, D] tokens, position embeddings added (`add_pos_embed`), or any subset
                of them (MAE encodes the visible ones only).
            keys: [B, T] bool, True on tokens that may be attended (`key_mask`); None: all.
            grid: the (h, w) patch grid the tokens after the prefix tile, row-major; only
                windowed attention needs it (a token subset has none: windows refuse it).
            intermediates, attentions: block indices whose raw outputs / attention maps to keep.
            rope: the rotary embeddings of the patch tokens (`rotary`): required when the
                encoder has RoPE, for the last h*w tokens of x.

        Returns:
            the normalised tokens [B, T, D], {block: raw output [B, T, D]} and {block:
            attention [B, heads, T, T]} for the blocks asked for.
        """
        for i in (*intermediates, *attentions):
            if not -self.depth <= i < self.depth:
                raise ValueError(f"block index {i} is out of range for depth {self.depth}")
        want_out = {i % self.depth for i in intermediates}
        want_attn = {i % self.depth for i in attentions}
        window = self.window_for(grid) if grid is not None else None
        if window is None and grid is None and (self.window_size is not None or self.num_windows is not None):
            raise ValueError("windowed attention needs the tokens' patch grid (forward_tokens(grid=...))")
        if (rope is None) != (self.rope is None):
            raise ValueError(
                "forward_tokens: an encoder with RoPE needs rope=backbone.rotary(image_sizes), and only it"
            )
        attn_mask = keys[:, None, None, :] if keys is not None else None
        outs, attns = {}, {}
        for i in range(self.depth):
            x, attn = self.run_block(i, x, attn_mask, window, i in want_attn, rope)
            if i in want_out:
                outs[i] = x
            if attn is not None:
                attns[i] = attn
        return self.norm(x), outs, attns

    def run_block(
        self,
        i: int,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None,
        window: Window | None = None,
        return_attention: bool = False,
        rope: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Block `i` over tokens x [B, T, D] -> ([B, T, D], attention or None), recomputed in
        backward under gradient checkpointing. attn_mask: bool, broadcastable to [B, heads,
        T, T], True where a query may attend a key; `window` applies unless block i is one of
        `global_attn_indexes`; rope: `rotary`'s output (its block i part is used)."""
        blk = self.blocks[i]
        window = window if i not in self.global_attn_indexes else None
        if rope is not None:
            rope = rope[i if rope.shape[0] > 1 else 0]
        if self.grad_checkpointing and torch.is_grad_enabled():
            return checkpoint(blk, x, attn_mask, return_attention, window, rope, use_reentrant=False)
        return blk(x, attn_mask, return_attention, window, rope)

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | Sequence[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        output_fmt: Literal["NCHW", "NLC"] = "NCHW",
        intermediates_only: bool = False,
        image_sizes: ImageSizes | None = None,
    ) -> list | tuple[torch.Tensor, list]:
        """timm's `forward_intermediates`, for code written against timm (DPT- and ViTDet-style
        necks): the outputs of blocks `indices` (an int n: the last n; None: all), each
        [B, D, h, w] ("NCHW") or [B, h*w, D] ("NLC"), through the final norm if `norm`, with
        their prefix tokens [B, P, D] as pairs if `return_prefix_tokens`; and, unless
        `intermediates_only`, the final normalised tokens [B, P + h*w, D] first. Padded
        batches as `forward` takes them (`image_sizes`); heads inside vitdense read
        `forward(intermediates=...)` instead."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt={output_fmt!r}: expected 'NCHW' or 'NLC'")
        take, _ = feature_take_indices(self.depth, indices)
        f = self.forward(x, image_sizes, intermediates=take, norm_intermediates=norm)
        p, (h, w) = self.num_prefix_tokens, f.grid_size
        outs = []
        for y in f.intermediates:
            patches = y[:, p:]
            if output_fmt == "NCHW":
                patches = patches.transpose(1, 2).reshape(y.shape[0], -1, h, w)
            outs.append((patches, y[:, :p]) if return_prefix_tokens else patches)
        if intermediates_only:
            return outs
        return torch.cat([f.prefix_tokens, f.patch_tokens], 1), outs

    def forward(
        self,
        x: torch.Tensor,
        image_sizes: ImageSizes | None = None,
        intermediates: Sequence[int] = (),
        attentions: Sequence[int] = (),
        norm_intermediates: bool = False,
        stem_stages: Sequence[int] = (),
    ) -> ViTFeatures:
        """Encode a batch.

        Args:
            x: [B, C, H, W] images (any H, W), each top-left aligned and zero-padded right
                and bottom.
            image_sizes: the batch's `ImageSizes` (as `pad_collate` makes it); None: no
                image is padded.
            intermediates: block indices (negative from the end) whose raw outputs to return.
            attentions: block indices whose attention maps to return (computed unfused).
            norm_intermediates: pass the intermediates through the final norm (timm's
                `forward_intermediates(norm=True)`; what HF's and RF-DETR's DINOv2 backbones
                hand to their necks).
            stem_stages: a hybrid CNN's stages whose outputs to return (`HybridEmbed.forward_stages`).
        """
        request = EncoderRequest(tuple(intermediates), tuple(attentions), tuple(stem_stages))
        memo = getattr(self, "_one_pass", None)  # (a module unpickled from before one_pass has none)
        encoded = memo.lookup(x, image_sizes, request, self.depth, self.training) if memo is not None else None
        if encoded is None:
            encoded = self.encode(x, image_sizes, request if memo is None else memo.request.union(request))
            if memo is not None:
                memo.store(x, image_sizes, encoded, self.training)
        return self.features_of(encoded, request, norm_intermediates)

    def encode(self, x: torch.Tensor, image_sizes: ImageSizes | None, request: EncoderRequest) -> EncodedBatch:
        """One pass over images [B, C, H, W] computing what `request` asks (`forward` then
        hands each head its part: `features_of`)."""
        stem: dict[int, torch.Tensor] = {}
        if request.stem_stages:  # the hybrid CNN's stage maps from the same pass (DPT-Hybrid reads two)
            if not hasattr(self.patch_embed, "forward_stages"):
                raise ValueError(f"stem_stages={request.stem_stages}: only a hybrid patch embedding has CNN stages")
            full = image_sizes or ImageSizes.full(x.shape[0], tuple(x.shape[-2:]))
            tokens, maps = self.patch_embed.forward_stages(x, full, request.stem_stages)
            stem = dict(zip(request.stem_stages, maps, strict=True))
            image_sizes = full.at_stride(self.patch_size)
        else:
            tokens, image_sizes = self.embed(x, image_sizes)
        grid = (tokens.shape[1], tokens.shape[2])
        x = self.add_pos_embed(tokens, image_sizes)
        keys = self.key_mask(image_sizes, x.device)
        rope = self.rotary(image_sizes, x.device)
        x, outs, attns = self.forward_tokens(x, keys, grid, request.intermediates, request.attentions, rope)
        if keys is not None:
            x = x.masked_fill(~keys[..., None], 0.0)  # (prefix tokens are always keys: only padding is zeroed)
        return EncodedBatch(x, grid, image_sizes, outs, attns, stem, request)

    def features_of(self, encoded: EncodedBatch, request: EncoderRequest, norm_intermediates: bool) -> ViTFeatures:
        """What `request` asks of a pass, as `ViTFeatures` (block outputs through the final
        norm when `norm_intermediates`)."""
        for i in (*request.intermediates, *request.attentions):
            if not -self.depth <= i < self.depth:
                raise ValueError(f"block index {i} is out of range for depth {self.depth}")
        p = self.num_prefix_tokens
        prefix, patches = encoded.tokens[:, :p], encoded.tokens[:, p:]
        blocks = (encoded.blocks[i % self.depth] for i in request.intermediates)
        return ViTFeatures(
            cls_token=prefix[:, 0] if self.cls_token is not None else None,
            patch_tokens=patches,
            grid_size=encoded.grid,
            image_sizes=encoded.image_sizes,
            prefix_tokens=prefix,
            intermediates=tuple(self.norm(y) if norm_intermediates else y for y in blocks),
            attentions=tuple(encoded.attentions[i % self.depth] for i in request.attentions),
            stem_features=tuple(encoded.stem[s] for s in request.stem_stages),
        )

    @contextmanager
    def one_pass(self, request: EncoderRequest | None = None) -> Iterator[OnePass]:
        """Inside, calls on the same images share one pass of the encoder
        (`vitdense.backbone.one_pass`): the first computes `request` (what every head that
        will call declared, `request_of`) and what it asks itself; later calls are answered
        from it. Nested blocks share the outer one's passes."""
        outer = getattr(self, "_one_pass", None)
        if outer is not None:
            outer.request = outer.request.union(request or EncoderRequest())
            yield outer
            return
        self._one_pass = OnePass(request or EncoderRequest())
        try:
            yield self._one_pass
        finally:
            self._one_pass = None
