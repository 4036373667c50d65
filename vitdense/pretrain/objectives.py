"""Self-supervised objectives on the shared backbone: the paper's masked patch prediction
and MAE. Each is a plain `nn.Module` built as `objective(embed_dim, patch_size, in_chans)`
(injected into `MaskedImageModelingTask` as heads are into the other tasks) and called
with the backbone: `objective(backbone, images, image_sizes)` -> `MaskedImageOutput`.

Only the backbone's own parameters are what pre-training is for: the objective's (mask
embedding, predictor, MAE's decoder) stay behind when a downstream task loads the
checkpoint's backbone (`backbone.checkpoint: runs/pretrain/checkpoints/last.ckpt`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from timm.layers import trunc_normal_
from torch import nn
from torch.utils.checkpoint import checkpoint

from vitdense.backbone import VisionTransformer
from vitdense.backbone.pos_embed import sincos_2d
from vitdense.backbone.vit import Block
from vitdense.core.errors import ConfigError
from vitdense.pretrain.masking import TokenMasking, corrupt_tokens, random_masking
from vitdense.pretrain.targets import MeanColorTarget, PatchTarget, PixelTarget, patchify, pixel_validity
from vitdense.types import ImageSizes

#: a target from nothing (YAML: `class_path` + `init_args`), e.g. `MeanColorTarget`
TargetFactory = Callable[[], PatchTarget]


class MaskedImageOutput(NamedTuple):
    """An objective's predictions on a batch.

    Attributes:
        pred: [B, N, O] prediction at every patch position of the padded grid.
        target: the target's values for the batch (`PatchTarget.forward`).
        hidden: [B, N] bool, the patches the loss is on (corrupted or masked; never padding).
        image_sizes: the batch's `ImageSizes` at the patch stride (the grid is its `grid`).
    """

    pred: torch.Tensor
    target: tuple
    hidden: torch.Tensor
    image_sizes: ImageSizes


class MaskedImageObjective(nn.Module):
    """What the objectives share: the target, the data's normalisation (to un-normalise for
    colour targets and pictures), the loss and scores. Subclasses implement `forward`."""

    def __init__(self, target: PatchTarget, patch_size: int | tuple[int, int], in_chans: int) -> None:
        super().__init__()
        self.target = target
        self.patch_size: tuple[int, int] = (
            (patch_size, patch_size) if isinstance(patch_size, int) else tuple(patch_size)
        )
        self.in_chans = in_chans
        # the data's normalisation; the task sets it from the DataModule (`set_normalization`)
        self.register_buffer("pixel_mean", torch.full((in_chans,), 0.5))
        self.register_buffer("pixel_std", torch.full((in_chans,), 0.5))

    def set_normalization(self, mean: list[float] | tuple[float, ...], std: list[float] | tuple[float, ...]) -> None:
        """The mean and std [C] the images were normalised with (pixel values in [0, 1])."""
        self.pixel_mean.copy_(torch.as_tensor(mean, dtype=torch.float32))
        self.pixel_std.copy_(torch.as_tensor(std, dtype=torch.float32))

    def prepare_backbone(self, backbone: VisionTransformer) -> None:
        """Change the backbone before training from scratch, if the objective's recipe does
        (MAE: fixed sine-cosine position embeddings). Called by the task; default: nothing."""

    def targets(self, images: torch.Tensor, image_sizes: ImageSizes) -> tuple:
        """The target of every patch of images [B, C, H, W] padded as `image_sizes` (at any
        stride) says."""
        patches = patchify(images, self.patch_size)
        valid = pixel_validity(image_sizes, self.patch_size, images.device)
        return self.target(patches, valid, self.patch_size, self.pixel_mean, self.pixel_std)

    def loss(self, output: MaskedImageOutput) -> torch.Tensor:
        return self.target.loss(output.pred, output.target, output.hidden)

    def scores(self, output: MaskedImageOutput) -> dict[str, tuple]:
        return self.target.scores(output.pred.detach(), output.target, output.hidden)

    def forward(
        self,
        backbone: VisionTransformer,
        images: torch.Tensor,
        image_sizes: ImageSizes | None = None,
        generator: torch.Generator | None = None,
    ) -> MaskedImageOutput:
        raise NotImplementedError


class MaskedPatchPrediction(MaskedImageObjective):
    """The paper's self-supervision (section 4.6, appendix B.1.2): corrupt `corrupt_ratio`
    of each image's patch embeddings — `mask_prob` of them replaced by a learned [mask]
    embedding, `random_prob` by another patch's embedding, the rest kept — and predict each
    corrupted patch's target (default: its 3-bit mean colour, 512 classes) from its output
    token with a linear layer.

    The corruption acts on the patch embeddings, after the patch projection and before the
    position embeddings are added (as BERT corrupts word embeddings before adding positions):
    a [mask] token then still says where it is, which the prediction needs; corrupting after
    the sum would erase the position together with the content.

    Args:
        embed_dim, patch_size, in_chans: the backbone's (the task supplies them).
        corrupt_ratio: fraction of each image's patches corrupted (paper: 50%; BERT's 15%
            was "slightly worse").
        mask_prob, random_prob: shares of the corrupted patches replaced by [mask] and by a
            random patch (paper: 80% / 10%; the remaining 10% stay as they are).
        target: what is predicted (`MeanColorTarget()`: the paper's choice;
            `MeanColorTarget(cells=4)` and `PixelTarget()`: the two it compared).
    """

    def __init__(
        self,
        embed_dim: int,
        patch_size: int | tuple[int, int],
        in_chans: int = 3,
        corrupt_ratio: float = 0.5,
        mask_prob: float = 0.8,
        random_prob: float = 0.1,
        target: TargetFactory = MeanColorTarget,
    ) -> None:
        super().__init__(target(), patch_size, in_chans)
        self.corrupt_ratio, self.mask_prob, self.random_prob = corrupt_ratio, mask_prob, random_prob
        self.mask_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.predictor = nn.Linear(embed_dim, self.target.num_outputs(self.patch_size, in_chans))
        trunc_normal_(self.mask_token, std=0.02)
        trunc_normal_(self.predictor.weight, std=0.02)
        nn.init.zeros_(self.predictor.bias)

    def forward(
        self,
        backbone: VisionTransformer,
        images: torch.Tensor,
        image_sizes: ImageSizes | None = None,
        generator: torch.Generator | None = None,
    ) -> MaskedImageOutput:
        tokens, sizes = backbone.embed(images, image_sizes)  # [B, h, w, D]
        b, h, w, d = tokens.shape
        c = corrupt_tokens(sizes, self.corrupt_ratio, self.mask_prob, self.random_prob, generator, images.device)
        flat = tokens.reshape(b, h * w, d)
        x = torch.where(c.replaced[..., None], self.mask_token.to(flat.dtype), flat)
        x = torch.where(c.randomized[..., None], flat.reshape(b * h * w, d)[c.source], x)
        x = backbone.add_pos_embed(x.reshape(b, h, w, d), sizes)
        keys, rope = backbone.key_mask(sizes, x.device), backbone.rotary(sizes, x.device)
        x, _, _ = backbone.forward_tokens(x, keys, (h, w), rope=rope)
        pred = self.predictor(x[:, backbone.num_prefix_tokens :])
        return MaskedImageOutput(pred, self.targets(images, sizes), c.corrupted, sizes)


class MaskedAutoencoder(MaskedImageObjective):
    """MAE (He et al. 2022): hide `mask_ratio` of each image's patches (a per-sample random
    shuffle), encode only the visible ones, and reconstruct the pixels of the hidden ones
    with a light decoder of its own width and depth; the loss is on hidden patches only.

    The encoder sees the visible tokens with their position embeddings (added before the
    masking, as MAE does) and the prefix tokens. The decoder maps them to its width, puts a
    learned mask token at every hidden position, adds its own fixed 2D sine-cosine position
    embeddings, and predicts every patch's pixels. In a padded batch the padding positions
    are neither visible nor targets nor keys of the decoder's attention, and an image with
    fewer tokens keeps fewer (its share of `mask_ratio`, exactly).

    Args:
        embed_dim, patch_size, in_chans: the backbone's (the task supplies them).
        mask_ratio: fraction of each image's patches hidden (MAE: 0.75).
        decoder_embed_dim, decoder_depth, decoder_num_heads, mlp_ratio: the decoder (MAE: 512
            wide, 8 blocks, 16 heads; its ablation: even 1 block works for fine-tuning).
        norm_pix_loss: MAE's per-patch normalised pixel targets (`PixelTarget(norm_pix=True)`);
            MAE's recipe turns it on (+0.5 top-1 in its ablation).
        sincos_pos_embed: as MAE, set the encoder's position table to fixed 2D sine-cosine
            embeddings (no gradient) when training from scratch; the table is stored as
            usual, so downstream tasks load it as learned embeddings (MAE's fine-tuning).
    """

    def __init__(
        self,
        embed_dim: int,
        patch_size: int | tuple[int, int],
        in_chans: int = 3,
        mask_ratio: float = 0.75,
        decoder_embed_dim: int = 512,
        decoder_depth: int = 8,
        decoder_num_heads: int = 16,
        mlp_ratio: float = 4.0,
        norm_pix_loss: bool = False,
        sincos_pos_embed: bool = True,
    ) -> None:
        super().__init__(PixelTarget(norm_pix=norm_pix_loss), patch_size, in_chans)
        self.mask_ratio = mask_ratio
        self.sincos_pos_embed = sincos_pos_embed
        self.decoder_embed = nn.Linear(embed_dim, decoder_embed_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_embed_dim))
        self.decoder_blocks = nn.ModuleList(
            Block(decoder_embed_dim, decoder_num_heads, mlp_ratio, qkv_bias=True, norm_eps=1e-6)
            for _ in range(decoder_depth)
        )
        self.decoder_norm = nn.LayerNorm(decoder_embed_dim, eps=1e-6)
        self.decoder_pred = nn.Linear(decoder_embed_dim, self.target.num_outputs(self.patch_size, in_chans))
        self.grad_checkpointing = False
        self._init_weights()

    def _init_weights(self) -> None:
        """MAE's: Xavier-uniform linear layers, zero biases, mask token N(0, 0.02)."""
        nn.init.normal_(self.mask_token, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute the decoder's blocks in backward (followed from the backbone's setting)."""
        self.grad_checkpointing = enable

    def prepare_backbone(self, backbone: VisionTransformer) -> None:
        if not self.sincos_pos_embed:
            return
        if backbone.pos_embed is None:
            raise ConfigError(
                "MaskedAutoencoder(sincos_pos_embed=True) fixes the encoder's absolute position table, but "
                f"{type(backbone).__name__} has none (rotary embeddings only): set sincos_pos_embed: false"
            )
        h, w = backbone.grid_size
        table = backbone.pos_embed
        patch = sincos_2d(table.shape[-1], (h, w), dtype=table.dtype, device=table.device)
        prefix = table.shape[1] - h * w  # the class token's entry: zeros, as MAE's
        with torch.no_grad():
            table.copy_(torch.cat([table.new_zeros(prefix, table.shape[-1]), patch])[None])
        table.requires_grad_(False)

    def forward(
        self,
        backbone: VisionTransformer,
        images: torch.Tensor,
        image_sizes: ImageSizes | None = None,
        generator: torch.Generator | None = None,
    ) -> MaskedImageOutput:
        if backbone.window_size is not None or backbone.num_windows is not None:
            raise ValueError("MaskedAutoencoder encodes a subset of the tokens: a windowed backbone cannot take it")
        tokens, sizes = backbone.embed(images, image_sizes)
        h, w = tokens.shape[1:3]
        x = backbone.add_pos_embed(tokens, sizes)  # [B, P + N, D]
        p = backbone.num_prefix_tokens
        m = random_masking(sizes, self.mask_ratio, generator, images.device)
        d = x.shape[-1]
        visible = torch.gather(x[:, p:], 1, m.ids_keep[..., None].expand(-1, -1, d))
        keys = None
        if not m.filled:
            keys = torch.cat([m.keep_valid.new_ones(x.shape[0], p), m.keep_valid], 1)
        rope = backbone.rotary(sizes, images.device)
        if rope is not None:  # the visible tokens keep their own rotary positions
            rope = rope.expand(-1, x.shape[0], -1, -1, -1)
            ids = m.ids_keep[None, :, :, None, None].expand(rope.shape[0], -1, -1, *rope.shape[3:])
            rope = torch.gather(rope, 2, ids)
        latent, _, _ = backbone.forward_tokens(torch.cat([x[:, :p], visible], 1), keys, rope=rope)
        pred = self.decode(latent, m, p, (h, w), backbone.key_mask(sizes, images.device))
        return MaskedImageOutput(pred, self.targets(images, sizes), m.masked, sizes)

    def decode(
        self,
        latent: torch.Tensor,
        masking: TokenMasking,
        num_prefix: int,
        grid: tuple[int, int],
        keys: torch.Tensor | None,
    ) -> torch.Tensor:
        """Encoder output [B, P + K, D] -> pixels of every patch [B, N, P * P * C].

        Visible tokens return to their positions (MAE's unshuffle by `ids_restore`), every
        other position gets the mask token; `keys` [B, P + N] keeps padding out of attention.
        """
        y = self.decoder_embed(latent)
        b, _, d = y.shape
        n = masking.ids_restore.shape[1]
        token = self.mask_token.to(y.dtype)
        visible = y[:, num_prefix:]
        if not masking.filled:  # filler slots of images that keep fewer tokens: hidden there
            visible = torch.where(masking.keep_valid[..., None], visible, token)
        slots = torch.cat([visible, token.expand(b, n - visible.shape[1], d)], 1)
        patches = torch.gather(slots, 1, masking.ids_restore[..., None].expand(-1, -1, d))
        pos = sincos_2d(d, grid, dtype=y.dtype, device=y.device)
        z = torch.cat([y[:, :num_prefix], patches + pos], 1)  # the prefix's position embedding is zero
        attn_mask = keys[:, None, None, :] if keys is not None else None
        for block in self.decoder_blocks:
            if self.grad_checkpointing and torch.is_grad_enabled():
                z, _ = checkpoint(block, z, attn_mask, use_reentrant=False)
            else:
                z, _ = block(z, attn_mask)
        return self.decoder_pred(self.decoder_norm(z)[:, num_prefix:])
