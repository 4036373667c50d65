"""DETR's detection head (Carion et al., ECCV 2020) on a ViT's patch tokens.

    patch tokens [B, N, D] --input_proj--> memory [B, N, d]   (+ sine positions of the valid area)
    (optional) transformer encoder layers over the memory    (0 by default: the ViT is one)
    object queries [Q, d] --decoder layers (self-attn, cross-attn to memory, FFN)--> [L, B, Q, d]
    every layer's output --class head--> [B, Q, K + 1]    --box MLP + sigmoid--> [B, Q, 4] (cx, cy, w, h)
    (class and box heads, reference boxes and their refinement in fp32 under any autocast)

As in DETR: post-norm layers with a final decoder norm; object query embeddings are added
to the queries and keys of self-attention and to the queries of cross-attention, memory
positions to the keys of cross-attention only; the decoder input starts at zero; the class
head is shared by all layers, and so is the box head unless boxes are refined (below). Padding tokens are masked out of cross-attention
(and of the encoder), and the positions are normalised over each image's own valid area, so
an image's detections do not depend on the batch it is padded into.

Two options for faster convergence, both off by default (the default is DETR):

- Group DETR (Chen et al., ICCV 2023), `num_groups > 1`: in training the queries come in
  K groups that do not attend to each other and are each matched one-to-one; at inference
  only the first group runs, so the deployed model is plain DETR.
- A locality prior for a single-scale plain-ViT memory, `box_bias=True`: Plain-DETR's
  box-to-pixel relative position bias (Lin et al., ICCV 2023), added to the cross-attention
  logits of every layer from that layer's reference boxes (`box_bias_mode`: vitdense's
  variant in offsets normalised to the image, or Plain-DETR's own in pixels; see
  `BoxRelativePositionBias`). The reference boxes come from iterative box refinement: a
  learned initial box per query, which each layer refines (a box head predicts an offset in
  inverse-sigmoid space; the next layer's reference is the refined box, detached as in
  Deformable DETR). With refinement each decoder layer has its own box head, as Deformable
  DETR's `with_box_refine`, Plain-DETR and LW-DETR have (`share_box_head=True`: one for all,
  the layout before this option; its checkpoints load into the per-layer one).
"""

from __future__ import annotations

import copy
import math
from typing import Any, Literal

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import nn

from vitdense.backbone import ViTFeatures
from vitdense.backbone.attention import fused_attention
from vitdense.heads.keypoints import KeypointHead
from vitdense.types import DetectionOutput, ImageSizes


def sine_position_embedding(
    image_sizes: ImageSizes,
    num_pos_feats: int = 128,
    temperature: float = 10000.0,
    scale: float = 2 * math.pi,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """DETR's 2D sine position encoding of a (possibly padded) grid.

    The position of row r (column c) is (r + 1) divided by the image's own height (width)
    in tokens and multiplied by `scale` — what DETR computes as the cumulative sum of its
    mask's valid area —, so that each image's positions span (0, scale] whatever padding
    surrounds it; padding rows and columns repeat the last one.

    Args:
        image_sizes: the batch at the token stride (`ViTFeatures.image_sizes`).
        num_pos_feats: features per axis (half the model width).

    Returns:
        [B, h * w, 2 * num_pos_feats]: the y features, then the x features, each
        interleaving sin and cos of the position over geometric frequencies.
    """
    h, w = image_sizes.grid
    extent = image_sizes.grids_tensor(torch.float32, device)  # [B, 2]
    eps = 1e-6
    rows = torch.arange(1, h + 1, dtype=torch.float32, device=device)[None, :].minimum(extent[:, :1])  # [B, h]
    cols = torch.arange(1, w + 1, dtype=torch.float32, device=device)[None, :].minimum(extent[:, 1:])  # [B, w]
    y_embed = (rows / (extent[:, :1] + eps) * scale)[:, :, None].expand(-1, h, w)
    x_embed = (cols / (extent[:, 1:] + eps) * scale)[:, None, :].expand(-1, h, w)
    dim_t = torch.arange(num_pos_feats, dtype=torch.float32, device=device)
    dim_t = temperature ** (2 * torch.div(dim_t, 2, rounding_mode="floor") / num_pos_feats)
    pos_x = x_embed[..., None] / dim_t
    pos_y = y_embed[..., None] / dim_t
    pos_x = torch.stack((pos_x[..., 0::2].sin(), pos_x[..., 1::2].cos()), dim=4).flatten(3)
    pos_y = torch.stack((pos_y[..., 0::2].sin(), pos_y[..., 1::2].cos()), dim=4).flatten(3)
    return torch.cat((pos_y, pos_x), dim=3).flatten(1, 2)


def exported_attention(
    attn: nn.MultiheadAttention,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_padding_mask: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """What `attn` (batch_first, in evaluation) returns for query [B, Q, d], key and value
    [B, N, d], computed batch-first: the graph `torch.export` traces with a symbolic batch.

    `nn.MultiheadAttention` projects its inputs sequence-first, folding [N, B, d] to
    [N * B, d]; with N and B both symbolic (the memory of a dynamic-size, dynamic-batch
    export) that reshape is decided by a guard true for B > 1 only, which the `.pt2` keeps:
    the saved program then refuses a batch of 1 ("Guard failed: ... % (images.size()[0] *
    ...) != 0"). The same weights and masks here: key_padding_mask [B, N] bool (True: not
    a key), attn_mask [Q, N] bool (True: may not look) or float [B * heads, Q, N] (added)."""
    b, q, d = query.shape
    heads = attn.num_heads
    w_q, w_k, w_v = attn.in_proj_weight.chunk(3)
    b_q, b_k, b_v = attn.in_proj_bias.chunk(3) if attn.in_proj_bias is not None else (None,) * 3

    def split(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, weight, bias).unflatten(-1, (heads, d // heads)).transpose(1, 2)  # [B, heads, L, d/heads]

    mask = None
    if attn_mask is not None:
        mask = attn_mask if attn_mask.is_floating_point() else torch.zeros_like(attn_mask, dtype=query.dtype)
        if not attn_mask.is_floating_point():
            mask = mask.masked_fill(attn_mask, float("-inf"))
        mask = mask.unflatten(0, (b, heads)) if mask.dim() == 3 else mask
    if key_padding_mask is not None:
        padding = torch.zeros_like(key_padding_mask, dtype=query.dtype).masked_fill(key_padding_mask, float("-inf"))
        mask = padding[:, None, None] if mask is None else mask + padding[:, None, None]
    out = F.scaled_dot_product_attention(split(query, w_q, b_q), split(key, w_k, b_k), split(value, w_v, b_v), mask)
    return attn.out_proj(out.transpose(1, 2).flatten(2))


def inverse_sigmoid(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """log(x / (1 - x)), clamped away from 0 and 1, in fp32 whatever the input's dtype (in
    bf16, 1 - eps rounds to 1 and any x >= 0.998 to 1, which gives inf)."""
    x = x.float().clamp(eps, 1 - eps)
    return torch.log(x / (1 - x))


#: how `BoxRelativePositionBias` measures a box's offsets from the tokens
BoxBiasMode = Literal["normalised", "pixels"]


class BoxRelativePositionBias(nn.Module):
    """Plain-DETR's decomposed box-to-pixel relative position bias (BoxRPB), in two variants.

    For a query's reference box (x1, y1, x2, y2) and a memory token centred at (x, y), the
    offsets (x1 - x, x2 - x) and (y1 - y, y2 - y) go through one small MLP per axis to one
    bias per head; the token's bias is the sum of its column's and its row's. Padding tokens
    get no special value here: the key padding mask removes them.

    `mode="pixels"` is Plain-DETR's as released (`GlobalCrossAttention` with `rpe_type=
    "linear"`, its default and its configs'): the box and the token centres in pixels of the
    image at the feature stride s — box times the image's extent in tokens times s (what
    Plain-DETR's valid ratios times the padded map's size times `feature_stride` give), token
    j's centre at (j + 0.5) s —, the offsets fed to the MLPs as they are; MLP weights drawn
    by timm's `trunc_normal_(std=0.02)` and biases zero, as Plain-DETR's decoder initialises
    them, and no bias in the MLPs' last layer (a constant per head that the softmax ignores).
    Plain-DETR uses `hidden_dim=512` (`decoder_rpe_hidden_dim`).

    `mode="normalised"` is vitdense's variant (the default, what checkpoints before the
    option were trained with): box and token centres in units of the image's valid area
    ([0, 1], whatever its size in pixels), offsets log-scaled as sign(d) log2(8 |d| + 1) / 3
    (Plain-DETR's `abs_log8` transform applied to 8 d) to keep the MLP's input near [-1, 1];
    PyTorch's default initialisation and a bias in the MLPs' last layer.

    Args:
        num_heads: attention heads (one bias each).
        hidden_dim: width of the per-axis MLPs.
        mode: "pixels" (Plain-DETR's) or "normalised" (vitdense's variant).
    """

    def __init__(self, num_heads: int, hidden_dim: int = 256, mode: BoxBiasMode = "normalised") -> None:
        super().__init__()
        if mode not in ("normalised", "pixels"):
            raise ValueError(f"box bias mode={mode!r}: expected 'normalised' (vitdense's) or 'pixels' (Plain-DETR's)")
        self.num_heads = num_heads
        self.mode = mode
        pixels = mode == "pixels"
        self.mlp_x = MLP(2, hidden_dim, num_heads, 2, last_bias=not pixels)
        self.mlp_y = MLP(2, hidden_dim, num_heads, 2, last_bias=not pixels)
        if pixels:
            for layer in (*self.mlp_x.layers, *self.mlp_y.layers):
                trunc_normal_(layer.weight, std=0.02)
                if layer.bias is not None:
                    nn.init.zeros_(layer.bias)

    @staticmethod
    def log_scale(delta: torch.Tensor) -> torch.Tensor:
        # fine steps near the box edges, coarse ones far from them (Plain-DETR's log-space)
        return torch.sign(delta) * torch.log2(delta.abs() * 8 + 1) / 3

    def forward(self, boxes: torch.Tensor, image_sizes: ImageSizes) -> torch.Tensor:
        """boxes [B, Q, 4] (cx, cy, w, h) in [0, 1]; image_sizes at the token stride ->
        bias [B * num_heads, Q, h * w], as `nn.MultiheadAttention`'s attn_mask."""
        b, q, _ = boxes.shape
        h, w = image_sizes.grid
        x1y1x2y2 = torch.cat([boxes[..., :2] - boxes[..., 2:] / 2, boxes[..., :2] + boxes[..., 2:] / 2], -1)
        rows, cols = image_sizes.grids_tensor(boxes.dtype, boxes.device).unbind(1)  # [B]
        ys = torch.arange(h, device=boxes.device, dtype=boxes.dtype) + 0.5  # token centres in tokens
        xs = torch.arange(w, device=boxes.device, dtype=boxes.dtype) + 0.5
        if self.mode == "pixels":
            sh, sw = image_sizes.stride
            box_x = x1y1x2y2[..., 0::2] * (cols * sw)[:, None, None]  # [B, Q, 2] (x1, x2) in pixels
            box_y = x1y1x2y2[..., 1::2] * (rows * sh)[:, None, None]
            dx = box_x[:, :, None, :] - (xs * sw)[None, None, :, None]  # [B, Q, w, 2]
            dy = box_y[:, :, None, :] - (ys * sh)[None, None, :, None]  # [B, Q, h, 2]
        else:
            # token centres in units of each image's own extent (padding lies beyond 1)
            dx = x1y1x2y2[..., None, 0::2] - (xs[None] / cols[:, None])[:, None, :, None]  # [B, Q, w, 2]
            dy = x1y1x2y2[..., None, 1::2] - (ys[None] / rows[:, None])[:, None, :, None]  # [B, Q, h, 2]
            dx, dy = self.log_scale(dx), self.log_scale(dy)
        bias_x = self.mlp_x(dx)  # [B, Q, w, heads]
        bias_y = self.mlp_y(dy)  # [B, Q, h, heads]
        bias = bias_y[:, :, :, None, :] + bias_x[:, :, None, :, :]  # [B, Q, h, w, heads]
        return bias.flatten(2, 3).permute(0, 3, 1, 2).reshape(b * self.num_heads, q, h * w)


class MLP(nn.Module):
    """`num_layers` linear layers with ReLU between them (DETR's box head: 3 layers); the last
    one without a bias if `last_bias` is False."""

    def __init__(
        self, in_features: int, hidden_features: int, out_features: int, num_layers: int, last_bias: bool = True
    ) -> None:
        super().__init__()
        dims = [in_features] + [hidden_features] * (num_layers - 1) + [out_features]
        self.layers = nn.ModuleList(
            nn.Linear(a, b, bias=last_bias or i < num_layers - 1)
            for i, (a, b) in enumerate(zip(dims[:-1], dims[1:], strict=True))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == len(self.layers) - 1 else F.relu(layer(x))
        return x


class DETREncoderLayer(nn.Module):
    """Post-norm self-attention + FFN over the memory; positions added to queries and keys."""

    def __init__(self, dim: int, num_heads: int, dim_feedforward: int, dropout: float) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(dim, num_heads, dropout=dropout, batch_first=True)
        self.linear1 = nn.Linear(dim, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, src: torch.Tensor, pos: torch.Tensor, padding: torch.Tensor | None) -> torch.Tensor:
        """src, pos [B, N, d]; padding [B, N] True on padding tokens -> [B, N, d]."""
        q = k = src + pos
        # need_weights=True takes nn.MultiheadAttention's explicit path, False the fused kernel
        explicit = not fused_attention(src, self.self_attn.dropout if self.training else 0.0)
        if torch.compiler.is_exporting():  # (see exported_attention: the memory's length is symbolic)
            attn = exported_attention(self.self_attn, q, k, src, padding)
        else:
            attn = self.self_attn(q, k, src, key_padding_mask=padding, need_weights=explicit)[0]
        src = self.norm1(src + self.dropout(attn))
        ffn = self.linear2(self.dropout(F.relu(self.linear1(src))))
        return self.norm2(src + self.dropout(ffn))


class DETRDecoderLayer(nn.Module):
    """Post-norm self-attention, cross-attention to the memory, FFN (DETR's decoder layer)."""

    def __init__(self, dim: int, num_heads: int, dim_feedforward: int, dropout: float) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(dim, num_heads, dropout=dropout, batch_first=True)
        self.cross_attn = nn.MultiheadAttention(dim, num_heads, dropout=dropout, batch_first=True)
        self.linear1 = nn.Linear(dim, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.norm3 = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        tgt: torch.Tensor,
        query_pos: torch.Tensor,
        memory: torch.Tensor,
        pos: torch.Tensor,
        padding: torch.Tensor | None,
        self_attn_mask: torch.Tensor | None = None,
        cross_attn_bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """tgt, query_pos [B, Q, d]; memory, pos [B, N, d]; padding [B, N] True on padding
        tokens of the memory; self_attn_mask [Q, Q] True where a query may not look (other groups);
        cross_attn_bias [B * heads, Q, N] added to the cross-attention logits."""
        q = k = tgt + query_pos
        explicit = not fused_attention(tgt, self.self_attn.dropout if self.training else 0.0)
        attn = self.self_attn(q, k, tgt, attn_mask=self_attn_mask, need_weights=explicit)[0]
        tgt = self.norm1(tgt + self.dropout(attn))
        if cross_attn_bias is not None and padding is not None:
            # one float mask: nn.MultiheadAttention would otherwise combine a bool and a float mask
            cross_attn_bias = cross_attn_bias.masked_fill(
                padding.repeat_interleave(cross_attn_bias.shape[0] // tgt.shape[0], 0)[:, None, :], float("-inf")
            )
            padding = None
        if torch.compiler.is_exporting():  # (see exported_attention: the memory's length is symbolic)
            attn = exported_attention(self.cross_attn, tgt + query_pos, memory + pos, memory, padding, cross_attn_bias)
        else:
            attn = self.cross_attn(
                tgt + query_pos,
                memory + pos,
                memory,
                key_padding_mask=padding,
                attn_mask=cross_attn_bias,
                need_weights=explicit,
            )[0]
        tgt = self.norm2(tgt + self.dropout(attn))
        return self.feed_forward(tgt)

    def feed_forward(self, tgt: torch.Tensor) -> torch.Tensor:
        """The FFN with its residual and post-norm: [B, Q, d] -> [B, Q, d]."""
        ffn = self.linear2(self.dropout(F.relu(self.linear1(tgt))))
        return self.norm3(tgt + self.dropout(ffn))


class DETRHead(nn.Module):
    """DETR's transformer decoder, class head and box head over ViT patch tokens.

    Args:
        embed_dim: D of the backbone.
        num_classes: K object classes; the head adds "no object" as class K.
        hidden_dim: decoder width d.
        num_queries: object queries Q (per group).
        num_heads: attention heads.
        dim_feedforward: FFN width.
        dropout: dropout in attention and FFN.
        enc_layers: transformer encoder layers over the memory (DETR: 6; a ViT already is one).
        dec_layers: decoder layers.
        aux_loss: return every earlier layer's predictions for the auxiliary losses.
        num_groups: Group DETR query groups in training (1: plain DETR).
        box_bias: Plain-DETR's box-to-pixel relative position bias in cross-attention, with
            iterative box refinement (its reference boxes).
        box_bias_hidden: width of the bias MLPs (Plain-DETR: 512).
        box_bias_mode: how the bias measures offsets (`BoxRelativePositionBias`): "normalised"
            (vitdense's variant: units of the image, log-scaled) or "pixels" (Plain-DETR's).
        share_box_head: one box MLP for all decoder layers (True) or one per layer (False).
            None: shared without refinement (DETR), one per layer with it (Deformable DETR's
            `with_box_refine`, Plain-DETR, LW-DETR). A shared head's weights (checkpoints from
            before this option) load into per-layer heads as copies: the same function.
        num_keypoints: K > 0: every query also predicts its object's K keypoints relative
            to its box (`KeypointHead`, one for all layers), in `DetectionOutput.keypoints`.
    """

    def __init__(
        self,
        embed_dim: int,
        num_classes: int,
        hidden_dim: int = 256,
        num_queries: int = 100,
        num_heads: int = 8,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        enc_layers: int = 0,
        dec_layers: int = 6,
        aux_loss: bool = True,
        num_groups: int = 1,
        box_bias: bool = False,
        box_bias_hidden: int = 256,
        box_bias_mode: BoxBiasMode = "normalised",
        share_box_head: bool | None = None,
        num_keypoints: int = 0,
    ) -> None:
        super().__init__()
        if hidden_dim % 2:
            raise ValueError(f"hidden_dim={hidden_dim}: the sine positions need an even width")
        if num_groups < 1:
            raise ValueError(f"num_groups={num_groups}: expected at least 1")
        self.num_classes = num_classes
        self.num_queries = num_queries
        self.num_groups = num_groups
        self.aux_loss = aux_loss
        self.input_proj = nn.Linear(embed_dim, hidden_dim)
        self.encoder = nn.ModuleList(
            DETREncoderLayer(hidden_dim, num_heads, dim_feedforward, dropout) for _ in range(enc_layers)
        )
        self.decoder = nn.ModuleList(
            DETRDecoderLayer(hidden_dim, num_heads, dim_feedforward, dropout) for _ in range(dec_layers)
        )
        self.decoder_norm = nn.LayerNorm(hidden_dim)
        self.query_embed = nn.Embedding(num_queries * num_groups, hidden_dim)
        self.class_embed = nn.Linear(hidden_dim, num_classes + 1)
        self.bbox_embed: MLP | nn.ModuleList = MLP(hidden_dim, hidden_dim, 4, 3)
        self.box_bias = box_bias
        if box_bias:
            self.ref_point = nn.Linear(hidden_dim, 4)  # initial reference box of each query
            self.rpb = nn.ModuleList(
                BoxRelativePositionBias(num_heads, box_bias_hidden, box_bias_mode) for _ in range(dec_layers)
            )
            # refinement starts from the reference: zero offsets at initialisation
            nn.init.zeros_(self.bbox_embed.layers[-1].weight)
            nn.init.zeros_(self.bbox_embed.layers[-1].bias)
        self.share_box_head = not box_bias if share_box_head is None else share_box_head
        self.num_keypoints = num_keypoints
        self.keypoint_embed = KeypointHead(hidden_dim, num_keypoints) if num_keypoints else None
        if not self.share_box_head:
            # copies of the one initialised head, as Deformable DETR clones it: no random draws
            # (the rest initialises as with a shared head) and, at initialisation, the same function
            self.bbox_embed = nn.ModuleList(copy.deepcopy(self.bbox_embed) for _ in range(dec_layers))
        # DETR: Xavier-uniform for the transformer's matrices, PyTorch defaults elsewhere
        for layers in (self.encoder, self.decoder):
            for p in layers.parameters():
                if p.dim() > 1:
                    nn.init.xavier_uniform_(p)

    def group_mask(self, num_groups: int, device: torch.device) -> torch.Tensor | None:
        """[G*Q, G*Q] bool, True between queries of different groups (None for one group)."""
        if num_groups == 1:
            return None
        group = torch.arange(num_groups * self.num_queries, device=device) // self.num_queries
        return group[:, None] != group[None, :]

    def forward(self, features: ViTFeatures) -> DetectionOutput:
        """ViTFeatures (patch tokens [B, N, D] on grid (h, w), the batch's image sizes) ->
        `DetectionOutput` with logits [B, G*Q, K + 1] and boxes [B, G*Q, 4]; G is
        `num_groups` in training and 1 in evaluation."""
        tokens = features.patch_tokens
        b = tokens.shape[0]
        padding = features.padding()
        pos = sine_position_embedding(features.image_sizes, self.input_proj.out_features // 2, device=tokens.device).to(
            tokens.dtype
        )
        memory = self.input_proj(tokens)
        for layer in self.encoder:
            memory = layer(memory, pos, padding)

        groups = self.num_groups if self.training else 1
        query_pos = self.query_embed.weight[: groups * self.num_queries].unsqueeze(0).expand(b, -1, -1)
        self_attn_mask = self.group_mask(groups, tokens.device)
        tgt = torch.zeros_like(query_pos)
        outputs, boxes = [], []
        reference = self.initial_reference(query_pos) if self.box_bias else None
        for i, layer in enumerate(self.decoder):
            bias = self.rpb[i](reference, features.image_sizes).to(tgt.dtype) if reference is not None else None
            tgt = layer(tgt, query_pos, memory, pos, padding, self_attn_mask, bias)
            out = self.decoder_norm(tgt)
            outputs.append(out)
            if reference is not None:
                box = self.refine(reference, out, i)
                boxes.append(box)
                reference = box.detach()
        hs = torch.stack(outputs)  # [L, B, G*Q, d]
        with torch.autocast(hs.device.type, enabled=False):  # see `refine`: the heads in fp32
            logits = self.class_embed(hs.float())
            if boxes:
                boxes = torch.stack(boxes)
            elif self.share_box_head:
                boxes = self.bbox_embed(hs.float()).sigmoid()
            else:
                boxes = torch.stack([self.box_head(i)(h) for i, h in enumerate(hs.float())]).sigmoid()
        # (a one-layer decoder has none: zip over an empty slice puts an unbind into zero tensors in
        # an exported graph, which torch.export saves to a .pt2 it cannot load back)
        with_aux = self.aux_loss and len(logits) > 1
        aux = tuple(zip(logits[:-1], boxes[:-1], strict=True)) if with_aux else ()
        if self.keypoint_embed is None:
            return DetectionOutput(logits[-1], boxes[-1], aux, groups)
        keypoints = self.keypoint_embed(hs, boxes)  # [L, B, G*Q, K, 7]
        aux_keypoints = tuple(keypoints[:-1]) if with_aux else ()
        return DetectionOutput(logits[-1], boxes[-1], aux, groups, keypoints=keypoints[-1], aux_keypoints=aux_keypoints)

    def initial_reference(self, query_pos: torch.Tensor) -> torch.Tensor:
        """query_pos [B, Q, d] -> each query's learned first reference box [B, Q, 4] in fp32."""
        with torch.autocast(query_pos.device.type, enabled=False):
            return self.ref_point(query_pos.float()).sigmoid()

    def box_head(self, layer: int) -> MLP:
        """The box MLP of decoder layer `layer` (the shared one if `share_box_head`)."""
        return self.bbox_embed if self.share_box_head else self.bbox_embed[layer]

    def refine(self, reference: torch.Tensor, hidden: torch.Tensor, layer: int) -> torch.Tensor:
        """The reference boxes [B, Q, 4] moved by decoder layer `layer`'s box head's offsets
        from its hidden states [B, Q, d], in inverse-sigmoid space -> refined boxes [B, Q, 4],
        in fp32.

        The whole box path runs in fp32 under any autocast: bf16 steps are 2^-8 in [0.5, 1),
        up to a pixel and more at COCO's sizes (small objects' IoU with their own bf16-rounded
        boxes falls below 0.9), and a bf16 side >= 0.998 rounds to 1, whose inverse sigmoid is
        inf: such a box would never move again.
        """
        with torch.autocast(hidden.device.type, enabled=False):
            return (inverse_sigmoid(reference) + self.box_head(layer)(hidden.float())).sigmoid()

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        # One box head for all layers (`bbox_embed.layers.*`: DETR's, and box refinement's
        # before per-layer heads) loads into per-layer heads as one copy per layer, the same
        # function; the other way round would drop heads, so it stays an error that says why.
        shared = f"{prefix}bbox_embed.layers."
        if not self.share_box_head:
            for key in [k for k in state_dict if k.startswith(shared)]:
                value = state_dict.pop(key)
                for i in range(len(self.bbox_embed)):
                    state_dict[f"{prefix}bbox_embed.{i}.layers.{key.removeprefix(shared)}"] = value
        elif any(k.startswith(f"{prefix}bbox_embed.0.layers.") for k in state_dict):
            error_msgs.append(
                f"{prefix}bbox_embed: the weights hold one box head per decoder layer, this head shares one; "
                "build it with share_box_head=False (or None, with box_bias=True)"
            )
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
