"""Keypoints on a query-based detector: every object predicts, beside its class and box, its K
keypoints, placed relative to a box as RF-DETR's keypoint head places them
(x = cx + dx w, y = cy + dy h); the 7 numbers per keypoint are those RF-DETR's keypoint loss
reads (`vitdense.losses.keypoints`). Two designs:

- `KeypointHead` (`DETRHead`): an MLP from the object query's decoder state to all K at once,
  the head DETR keypoint baselines use, which any decoder can carry.
- Keypoint queries (`LWDETRHead`; RF-DETR 1.8's GroupPose decoder, Liu et al. 2023,
  "Group Pose"): each object query carries K keypoint queries of its own, made from it by
  `ConditionalQueryInitializer`; in every decoder layer (`KeypointQueryLayer`) the object
  and its keypoints attend to each other, each keypoint samples the image around the
  object's reference box, and an FFN follows. A shared MLP reads each keypoint query:

    object query [B, N, d] --ConditionalQueryInitializer--> keypoint queries [B, N, K, c]
    per layer: [object, its K keypoints] self-attention (c wide, per object)
               --> keypoints' deformable cross-attention at the object's reference box
               (a second projector's levels) --> FFN
    keypoint queries --MLP--> [.., K, 8]: (dx, dy, findable, visible, log l11, l21, log l22,
               a class logit summed over the K into the object's class logits)
"""

from __future__ import annotations

import torch
from torch import nn
from torchvision.ops import MLP

from vitdense.heads.deformable import MSDeformAttn
from vitdense.types.keypoints import KEYPOINT_CHANNELS


def place_keypoints(delta: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """delta [..., K, C >= 7] a head's raw keypoint outputs, boxes [..., 4] (cx, cy, w, h) ->
    [..., K, 7]: (x, y) = box centre + (dx, dy) * box size, then the next 5 channels as they
    are. In the dtype of `delta`."""
    box = boxes.to(delta.dtype)[..., None, :]
    return torch.cat([delta[..., :2] * box[..., 2:] + box[..., :2], delta[..., 2:KEYPOINT_CHANNELS]], -1)


class KeypointHead(nn.Module):
    """An MLP from a query's decoder state to its K keypoints, placed relative to its box.

    Starts (zero last layer, as RF-DETR's keypoint head) with every keypoint at its box's
    centre, findable and visible probabilities 1/2 and the identity precision factor.

    Args:
        hidden_dim: decoder width d.
        num_keypoints: K.
        num_layers: MLP depth (DETR's box head's: 3).
    """

    def __init__(self, hidden_dim: int, num_keypoints: int, num_layers: int = 3) -> None:
        super().__init__()
        if num_keypoints < 1:
            raise ValueError(f"KeypointHead: num_keypoints={num_keypoints}; expected at least 1")
        self.num_keypoints = num_keypoints
        self.mlp = MLP(hidden_dim, [hidden_dim] * (num_layers - 1) + [num_keypoints * KEYPOINT_CHANNELS])
        last = [m for m in self.mlp if isinstance(m, nn.Linear)][-1]
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)

    def forward(self, hidden: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """hidden [..., d] decoder states, boxes [..., 4] their predicted (cx, cy, w, h) ->
        [..., K, 7]: (x, y) in [0, 1] of the unpadded image, findable and visible logits,
        log l11, l21, log l22; in fp32 under any autocast (as the box path: a bf16 step is
        2^-8 of the image near its far side).

        The box is detached: keypoints learn where they are within it, and the box learns
        from its own loss only (a keypoint error does not move the box)."""
        with torch.autocast(hidden.device.type, enabled=False):
            out = self.mlp(hidden.float()).unflatten(-1, (self.num_keypoints, KEYPOINT_CHANNELS))
            return place_keypoints(out, boxes.detach().float())


class ConditionalQueryInitializer(nn.Module):
    """K learned queries modulated by an object's state (adaLN, as DiT's blocks):
    q_k' = out_proj((1 + scale) * LN(q_k) + shift) * gate + q_k, with (scale, shift, gate) an
    MLP of the object's state (RF-DETR's keypoint query initialiser).

    Args:
        dim: d of the object state.
        num_queries: K.
        out_dim: c of the queries (default d).
    """

    def __init__(self, dim: int, num_queries: int, out_dim: int | None = None) -> None:
        super().__init__()
        out_dim = out_dim or dim
        self.queries = nn.Parameter(torch.randn(num_queries, out_dim))
        self.query_norm = nn.LayerNorm(out_dim, elementwise_affine=False)
        self.adaLN_modulation = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, 3 * out_dim))
        nn.init.zeros_(self.adaLN_modulation[-1].weight)
        nn.init.zeros_(self.adaLN_modulation[-1].bias)
        self.out_proj = nn.Linear(out_dim, out_dim)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        """state [..., d] -> queries [..., K, c]."""
        scale, shift, gate = self.adaLN_modulation(state[..., None, :]).chunk(3, -1)
        modulated = (1 + scale) * self.query_norm(self.queries) + shift
        return self.out_proj(modulated) * gate + self.queries


def _projection(dim: int, out_dim: int) -> nn.Module:
    # RF-DETR's keypoint stream projects between the widths only when they differ
    return nn.Linear(dim, out_dim) if dim != out_dim else nn.Identity()


class KeypointQueryLayer(nn.Module):
    """The keypoint stream of one decoder layer (RF-DETR's GroupPose branch of its decoder
    layer), run after the object queries' own self-attention, cross-attention and FFN.

    Post-norm, as the object stream: (1) self-attention over [object, its K keypoints] per
    object, the keypoints with their learned positions, the object without; the object takes
    its share through a layer scale that starts at 1e-6 (a trained detector is not
    disturbed), the keypoints theirs in full; (2) each keypoint's multi-scale deformable
    cross-attention around its object's reference box, queried with the object's position;
    (3) an FFN (ReLU, 4c wide).

    Args:
        dim: d of the object queries.
        keypoint_dim: c of the keypoint queries (RF-DETR: d / its `grouppose_keypoint_dim_downscale`).
        num_heads: self-attention heads.
        num_cross_heads: deformable cross-attention heads.
        num_levels, num_points: of the deformable cross-attention.
        dropout: in attention and FFN.
        cross_attn: with the keypoints' cross-attention (RF-DETR's `keypoint_cross_attn`).
    """

    def __init__(
        self,
        dim: int,
        keypoint_dim: int,
        num_heads: int,
        num_cross_heads: int,
        num_levels: int,
        num_points: int,
        dropout: float = 0.0,
        cross_attn: bool = True,
    ) -> None:
        super().__init__()
        self.in_proj = _projection(dim, keypoint_dim)
        self.pos_in_proj = _projection(dim, keypoint_dim)
        self.out_proj = _projection(keypoint_dim, dim)
        self.memory_in_proj = _projection(dim, keypoint_dim)
        self.self_attn = nn.MultiheadAttention(keypoint_dim, max(1, num_heads), dropout=dropout, batch_first=True)
        self.instance_norm = nn.LayerNorm(dim)
        self.norm1 = nn.LayerNorm(keypoint_dim)
        self.cross_attn = (
            MSDeformAttn(keypoint_dim, num_levels, max(1, num_cross_heads), num_points) if cross_attn else None
        )
        self.norm2 = nn.LayerNorm(keypoint_dim) if cross_attn else None
        self.linear1 = nn.Linear(keypoint_dim, 4 * keypoint_dim)
        self.linear2 = nn.Linear(4 * keypoint_dim, keypoint_dim)
        self.norm3 = nn.LayerNorm(keypoint_dim)
        self.dropout = nn.Dropout(dropout)
        self.layer_scale = nn.Parameter(torch.full((1,), 1e-6))

    def forward(
        self,
        tgt: torch.Tensor,
        query_pos: torch.Tensor,
        keypoints: torch.Tensor,
        keypoint_pos: torch.Tensor,
        reference_points: torch.Tensor,
        memory: torch.Tensor,
        spatial_shapes: tuple[tuple[int, int], ...],
        padding: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """tgt, query_pos [B, N, d] the objects after their layer; keypoints [B, N, K, c];
        keypoint_pos [K, c]; reference_points [B, N, L, 4] the objects' boxes as their
        cross-attention reads them; memory [B, S, d] the levels the keypoints sample,
        padding [B, S] -> (tgt [B, N, d], keypoints [B, N, K, c])."""
        b, n, k, c = keypoints.shape
        inst = self.in_proj(tgt)
        tokens = torch.cat([inst[:, :, None], keypoints], 2).flatten(0, 1)  # [B*N, 1+K, c]
        pos = torch.cat([torch.zeros_like(keypoint_pos[:1]), keypoint_pos])  # the object has no position here
        q = tokens + pos
        out = self.self_attn(q, q, tokens, need_weights=False)[0].unflatten(0, (b, n))
        tgt = self.instance_norm(tgt + self.dropout(self.out_proj(out[:, :, 0])) * self.layer_scale)
        keypoints = self.norm1(keypoints + self.dropout(out[:, :, 1:]))
        if self.cross_attn is not None:
            query = (keypoints + self.pos_in_proj(query_pos)[:, :, None]).flatten(1, 2)  # [B, N*K, c]
            reference = reference_points[:, :, None].expand(-1, -1, k, -1, -1).flatten(1, 2)
            attn = self.cross_attn(query, reference, self.memory_in_proj(memory), spatial_shapes, padding)
            keypoints = self.norm2(keypoints + self.dropout(attn.unflatten(1, (n, k))))
        ffn = self.linear2(self.dropout(self.linear1(keypoints).relu()))
        return tgt, self.norm3(keypoints + self.dropout(ffn))
