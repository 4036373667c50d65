"""An LW-DETR / RF-DETR class detection head on the plain ViT (Chen et al. 2024, "LW-DETR";
Robinson et al. 2025, "RF-DETR").

    ViTFeatures (+ the neck's intermediates) --neck--> levels [B, d, h_l, w_l] (+ their ImageSizes)
    levels --flatten--> memory [B, S, d], padding [B, S]           (no transformer encoder: the ViT is one)
    two-stage: memory --Linear+LN, class / box heads--> a proposal per token;
               the Q best tokens' boxes become the queries' reference boxes
    queries (learned content [Q, d]) --decoder layers: self-attn, deformable cross-attn to
               the levels around the reference box, FFN--> [L, B, Q, d]
    every layer --class head--> [B, Q, K] sigmoid logits   --box head--> reference box moved by it
    with keypoints: each query's K keypoint queries run beside it in every layer (RF-DETR's
               GroupPose decoder, `vitdense.heads.keypoints`) --MLP--> keypoints per layer

As RF-DETR (its defaults; each an argument): post-norm decoder layers; the query position is
an MLP of the sine embedding of the reference box (Conditional / DAB-DETR); the class and box
heads are shared by all layers; Group DETR in training (the groups run as a batch of their own
in self-attention, and each has its own two-stage heads), one group at inference;
box reparameterisation (`bbox_reparam`: a box head predicts (dx, dy, dw, dh) with centre
cx + dx * w and size w * exp(dw), in the image's units, instead of an offset in
inverse-sigmoid space); the reference boxes stay those of the two-stage proposals in every
layer (`refine_references=False`, RF-DETR's `lite_refpoint_refine`), or each layer starts
from the previous layer's box (detached), whose prediction gets its gradient through the
next layer too (DINO's look-forward-twice).

Padding: every level's `ImageSizes` gives its token mask and valid ratios; padding tokens
are never sampled as values (zeroed), never proposals, and reference boxes are scaled by
each level's valid ratios as Deformable DETR does, so an image's detections do not depend
on the batch it is padded into (tested). Two departures from RF-DETR make that hold, and
change nothing on unpadded batches (where the outputs equal RF-DETR's own code, tested):
padding and invalid tokens are kept out of the top-k selection (their score is -inf there;
RF-DETR zeroes their features but may still select them), and a query's position embedding
is that of its box in its own image (RF-DETR embeds the box scaled to the padded map). RF-DETR
itself never pads: it resizes every image to the same square.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import nn
from torchvision.ops import box_convert

from vitdense.backbone import ViTFeatures
from vitdense.heads.deformable import MSDeformAttn
from vitdense.heads.detr import MLP, DETRDecoderLayer, inverse_sigmoid
from vitdense.heads.keypoints import ConditionalQueryInitializer, KeypointQueryLayer, place_keypoints
from vitdense.heads.pyramid import FeatureLevels, MultiLevelProjector
from vitdense.types import BoxTargets, Denoising, DetectionOutput, ImageSizes
from vitdense.types.keypoints import KEYPOINT_CHANNELS

#: `neck(embed_dim, out_dim)` -> module from `ViTFeatures` to `FeatureLevels`
NeckFactory = Callable[[int, int], nn.Module]


def box_sine_embedding(boxes: torch.Tensor, num_feats: int, temperature: float = 10000.0) -> torch.Tensor:
    """Sine embedding of boxes [..., 4] (cx, cy, w, h) in [0, 1] -> [..., 4 * num_feats], in the
    order (cy, cx, w, h) as Conditional DETR / RF-DETR's `gen_sineembed_for_position`, each
    interleaving sin and cos over geometric frequencies of 2 pi x."""
    dim_t = torch.arange(num_feats, dtype=torch.float32, device=boxes.device)
    dim_t = temperature ** (2 * torch.div(dim_t, 2, rounding_mode="floor") / num_feats)
    parts = []
    for i in (1, 0, 2, 3):
        pos = boxes[..., i, None].float() * (2 * math.pi) / dim_t
        parts.append(torch.stack((pos[..., 0::2].sin(), pos[..., 1::2].cos()), -1).flatten(-2))
    return torch.cat(parts, -1)


def refine_boxes(reference: torch.Tensor, delta: torch.Tensor, reparam: bool) -> torch.Tensor:
    """Boxes [..., 4] (cx, cy, w, h) moved by a box head's `delta` [..., 4], in fp32.

    `reparam`: RF-DETR's box reparameterisation, (cx + dx w, cy + dy h, w e^dw, h e^dh);
    otherwise Deformable DETR's sigmoid(inverse_sigmoid(box) + delta)."""
    reference, delta = reference.float(), delta.float()
    if reparam:
        return torch.cat(
            [delta[..., :2] * reference[..., 2:] + reference[..., :2], delta[..., 2:].exp() * reference[..., 2:]], -1
        )
    return (inverse_sigmoid(reference) + delta).sigmoid()


def token_proposals(levels: FlatLevels, base_size: float = 0.05) -> tuple[torch.Tensor, torch.Tensor]:
    """One proposal box per memory token (Deformable DETR's two-stage anchors): the token's
    centre in units of its image's valid area, and a side of `base_size * 2**level`.

    Returns boxes [B, S, 4] (cx, cy, w, h) and valid [B, S] bool: False on padding tokens and
    on proposals with a coordinate outside (0.01, 0.99), as Deformable DETR and RF-DETR."""
    boxes, valid = [], []
    device = levels.memory.device
    for level, ((h, w), sizes) in enumerate(zip(levels.spatial_shapes, levels.image_sizes, strict=True)):
        extent = sizes.grids_tensor(torch.float32, device)  # [B, 2] (rows, cols)
        ys = (torch.arange(h, dtype=torch.float32, device=device) + 0.5)[None, :, None] / extent[:, 0, None, None]
        xs = (torch.arange(w, dtype=torch.float32, device=device) + 0.5)[None, None, :] / extent[:, 1, None, None]
        cx, cy = torch.broadcast_tensors(xs, ys)  # [B, h, w]
        side = torch.full_like(cx, base_size * 2.0**level)
        level_boxes = torch.stack([cx, cy, side, side], -1).flatten(1, 2)  # [B, h * w, 4]
        inside = ((level_boxes > 0.01) & (level_boxes < 0.99)).all(-1)
        boxes.append(level_boxes)
        valid.append(inside & ~sizes.mask(device).flatten(1))
    return torch.cat(boxes, 1), torch.cat(valid, 1)


class NoisedTargets(NamedTuple):
    """Denoising queries of a batch: labels [B, D], boxes [B, D, 4] (cx, cy, w, h), valid
    [B, D] (False on the padding of images with fewer targets), and per image the (query,
    target) pairs."""

    labels: torch.Tensor
    boxes: torch.Tensor
    valid: torch.Tensor
    matches: list[tuple[torch.Tensor, torch.Tensor]]


def denoising_queries(
    targets: Sequence[BoxTargets],
    num_groups: int,
    num_classes: int,
    label_noise: float,
    box_noise: float,
    device: torch.device | str | None = None,
) -> NoisedTargets:
    """`num_groups` noised copies of every image's targets (DN-DETR / DINO's positive queries).

    Group g of image b holds its n_b targets at queries g * n .. g * n + n_b - 1 (n: the
    batch's largest count). A label is redrawn uniformly with probability `label_noise`;
    each box corner moves uniformly within `box_noise` times half the box's width / height
    (DINO's), the box clipped to the image and kept at least 1e-4 wide. On `device` (the
    model's; default the targets').
    """
    device = device or targets[0].boxes.device
    b, n = len(targets), max(len(t.labels) for t in targets)
    size = num_groups * n
    labels = torch.zeros(b, size, dtype=torch.int64, device=device)
    boxes = torch.full((b, size, 4), 0.5, device=device)
    valid = torch.zeros(b, size, dtype=torch.bool, device=device)
    matches = []
    for i, t in enumerate(targets):
        k = len(t.labels)
        queries = (torch.arange(num_groups)[:, None] * n + torch.arange(k)[None]).flatten()
        labels[i, queries] = t.labels.repeat(num_groups).to(device)
        boxes[i, queries] = t.boxes.float().repeat(num_groups, 1).to(device)
        valid[i, queries] = True
        matches.append((queries, torch.arange(k).repeat(num_groups)))
    flip = torch.rand(b, size, device=device) < label_noise
    labels = torch.where(flip, torch.randint(num_classes, (b, size), device=device), labels)
    corners = box_convert(boxes, "cxcywh", "xyxy")
    half = boxes[..., 2:].repeat(1, 1, 2) / 2
    corners = (corners + (torch.rand_like(corners) * 2 - 1) * half * box_noise).clamp(0, 1)
    noised = box_convert(corners, "xyxy", "cxcywh")
    noised = torch.cat([noised[..., :2], noised[..., 2:].clamp(min=1e-4)], -1)
    return NoisedTargets(labels, torch.where(valid[..., None], noised, boxes), valid, matches)


def denoising_mask(valid: torch.Tensor, dn_groups: int, groups: int, num_queries: int) -> torch.Tensor:
    """Self-attention mask [B, D + G*Q, D + G*Q], True where a query may not look: the
    matching queries see neither the denoising queries (they would learn the answers) nor
    other matching groups; a denoising query sees its own denoising group and the matching
    queries (DN-DETR); padding denoising queries are seen by no one."""
    b, d = valid.shape
    n = d + groups * num_queries
    dn_group = torch.arange(d, device=valid.device) // (d // dn_groups)
    match_group = torch.arange(groups * num_queries, device=valid.device) // num_queries
    mask = torch.zeros(b, n, n, dtype=torch.bool, device=valid.device)
    mask[:, d:, :d] = True
    mask[:, d:, d:] = match_group[:, None] != match_group[None, :]
    mask[:, :d, :d] = dn_group[:, None] != dn_group[None, :]
    mask[:, :, :d] |= ~valid[:, None, :]
    return mask


class FlatLevels(NamedTuple):
    """The levels as the deformable decoder reads them.

    Attributes:
        memory: [B, S, d] every level's tokens, row-major, level after level; padding zeroed.
        padding: [B, S] bool, True on padding tokens; None without any.
        spatial_shapes: (h_l, w_l) of each level's (padded) map.
        valid_ratios: [B, L, 2] each image's share of each level's map, (x, y) order as
            Deformable DETR's `get_valid_ratio` (which is (w, h)).
        image_sizes: the batch's `ImageSizes` at each level's stride.
    """

    memory: torch.Tensor
    padding: torch.Tensor | None
    spatial_shapes: tuple[tuple[int, int], ...]
    valid_ratios: torch.Tensor
    image_sizes: tuple[ImageSizes, ...]

    @classmethod
    def of(cls, levels: FeatureLevels) -> FlatLevels:
        memory = torch.cat([m.flatten(2).transpose(1, 2) for m in levels.maps], 1)
        device = memory.device
        padding = None
        if any(sizes.has_padding for sizes in levels.image_sizes):
            padding = torch.cat([sizes.mask(device).flatten(1) for sizes in levels.image_sizes], 1)
            memory = memory.masked_fill(padding[..., None], 0.0)
        shapes = tuple((m.shape[-2], m.shape[-1]) for m in levels.maps)
        ratios = torch.stack([sizes.valid_ratios(device).flip(-1) for sizes in levels.image_sizes], 1)
        return cls(memory, padding, shapes, ratios, tuple(levels.image_sizes))


class LWDETRDecoderLayer(DETRDecoderLayer):
    """DETR's post-norm decoder layer with multi-scale deformable cross-attention around the
    reference boxes, self-attention within each query group (RF-DETR's decoder layer)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        num_cross_heads: int,
        dim_feedforward: int,
        dropout: float,
        num_levels: int,
        num_points: int,
    ) -> None:
        super().__init__(dim, num_heads, dim_feedforward, dropout)
        self.cross_attn = MSDeformAttn(dim, num_levels, num_cross_heads, num_points)

    def forward(
        self,
        tgt: torch.Tensor,
        query_pos: torch.Tensor,
        reference_points: torch.Tensor,
        levels: FlatLevels,
        num_groups: int,
        self_attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """tgt, query_pos [B, N, d] (N = G*Q, or with denoising queries D + G*Q);
        reference_points [B, N, L, 4] (boxes scaled by each level's valid ratios); levels:
        the flattened memory; self_attn_mask [B * heads, N, N] True where a query may not
        look (with denoising queries), else the G groups run as separate batches -> [B, N, d]."""
        b = tgt.shape[0]
        q = k = tgt + query_pos
        if self_attn_mask is not None:
            attn = self.self_attn(q, k, tgt, attn_mask=self_attn_mask, need_weights=False)[0]
        else:
            # the groups do not see each other: run them as G batches of Q queries (RF-DETR)
            q, k, v = (torch.cat(x.chunk(num_groups, 1), 0) for x in (q, k, tgt))
            attn = self.self_attn(q, k, v, need_weights=False)[0]
            # [G*B, Q, d] -> [B, G*Q, d]; unflatten, not split(b): a split's count (G*B / B) is
            # a guard that fixes an exported graph's batch to its example's
            attn = attn.unflatten(0, (num_groups, b)).transpose(0, 1).flatten(1, 2)
        tgt = self.norm1(tgt + self.dropout(attn))
        attn = self.cross_attn(tgt + query_pos, reference_points, levels.memory, levels.spatial_shapes, levels.padding)
        return self.feed_forward(self.norm2(tgt + self.dropout(attn)))


class LWDETRHead(nn.Module):
    """LW-DETR / RF-DETR's detection head over a plain ViT.

    Args:
        embed_dim: D of the backbone.
        num_classes: K object classes (sigmoid scores; no "no object" class).
        neck: `neck(embed_dim, hidden_dim)` -> levels (None: `MultiLevelProjector`, RF-DETR's
            P4; `SimpleFeaturePyramid`: ViTDet's); it names the backbone blocks it reads
            (`feature_indexes`), which the detector asks the backbone for. (None, not the
            class, as the default: see `DetectionTask`'s head.)
        hidden_dim: decoder width d (RF-DETR: 256).
        num_queries: Q object queries per group (RF-DETR: 300).
        num_groups: Group DETR groups in training (RF-DETR: 13); 1 at inference.
        num_heads: self-attention heads (RF-DETR: 8).
        num_cross_heads: deformable cross-attention heads (RF-DETR: 16).
        num_points: sampling points per head and level (RF-DETR: 2).
        dim_feedforward: FFN width (RF-DETR: 2048).
        dropout: in attention and FFN (RF-DETR: 0).
        dec_layers: decoder layers (RF-DETR: 3 for its base model).
        two_stage: reference boxes from the encoder's top-Q proposals (else learned boxes).
        bbox_reparam: RF-DETR's box reparameterisation (see `refine_boxes`).
        refine_references: each layer starts from the previous layer's box (with
            look-forward-twice); False keeps the first references (RF-DETR's
            `lite_refpoint_refine=True`, its default).
        aux_loss: return every earlier layer's predictions for the auxiliary losses.
        prior_prob: the class bias's initial probability (focal-loss init; 0.01).
        dn_groups: denoising groups in training (DN-DETR / DINO; 0: off, RF-DETR's): each
            group holds every target once as a query whose content is its (noised) class's
            embedding and whose reference is its noised box; they are supervised with their
            known targets (`DetectionOutput.dn`), unseen by the matching queries.
        dn_label_noise: probability that a denoising query's class is redrawn (DN-DETR's
            label flipping; DINO: 0.5).
        dn_box_noise: how far a denoising box's corners move, as a share of half its
            width and height (DINO's box_noise_scale: 1.0; DN-DETR: 0.4).
        num_keypoints: K > 0: every object query carries K keypoint queries through the
            decoder (RF-DETR's GroupPose decoder, `vitdense.heads.keypoints`), read by one MLP
            into the object's keypoints relative to its reference box, in
            `DetectionOutput.keypoints`; their class channel is summed into every class's
            logit (RF-DETR adds it to the logit of the class the schema belongs to: the same
            with one class).
        keypoint_dim_downscale: the keypoint queries are hidden_dim / this wide (RF-DETR's
            `grouppose_keypoint_dim_downscale`; its keypoint preview: 1).
        keypoint_cross_attn: the keypoint queries sample the image (RF-DETR's default: True).
        keypoint_neck: they sample a second neck's levels (RF-DETR's `dual_projector` with
            `dual_projector_kp_only`, its keypoint preview's); else the objects'.
    """

    def __init__(
        self,
        embed_dim: int,
        num_classes: int,
        neck: NeckFactory | None = None,
        hidden_dim: int = 256,
        num_queries: int = 300,
        num_groups: int = 13,
        num_heads: int = 8,
        num_cross_heads: int = 16,
        num_points: int = 2,
        dim_feedforward: int = 2048,
        dropout: float = 0.0,
        dec_layers: int = 3,
        two_stage: bool = True,
        bbox_reparam: bool = True,
        refine_references: bool = False,
        aux_loss: bool = True,
        prior_prob: float = 0.01,
        dn_groups: int = 0,
        dn_label_noise: float = 0.5,
        dn_box_noise: float = 1.0,
        num_keypoints: int = 0,
        keypoint_dim_downscale: int = 1,
        keypoint_cross_attn: bool = True,
        keypoint_neck: bool = True,
    ) -> None:
        super().__init__()
        if dn_groups < 0 or not 0 <= dn_label_noise <= 1 or not 0 <= dn_box_noise <= 1:
            raise ValueError(
                f"dn_groups={dn_groups}, dn_label_noise={dn_label_noise}, dn_box_noise={dn_box_noise}: expected "
                "dn_groups >= 0 and noises in [0, 1]"
            )
        if num_groups < 1 or num_queries < 1 or dec_layers < 1:
            raise ValueError(
                f"num_groups={num_groups}, num_queries={num_queries}, dec_layers={dec_layers}: expected >= 1"
            )
        if hidden_dim % 4:
            raise ValueError(f"hidden_dim={hidden_dim}: the box sine embedding needs a multiple of 4")
        self.num_classes = num_classes
        self.num_queries = num_queries
        self.num_groups = num_groups
        self.hidden_dim = hidden_dim
        self.two_stage = two_stage
        self.bbox_reparam = bbox_reparam
        self.refine_references = refine_references
        self.aux_loss = aux_loss
        self.neck = (neck or MultiLevelProjector)(embed_dim, hidden_dim)
        self.feature_indexes = tuple(getattr(self.neck, "feature_indexes", ()))
        num_levels = self.neck.num_levels
        self.decoder = nn.ModuleList(
            LWDETRDecoderLayer(hidden_dim, num_heads, num_cross_heads, dim_feedforward, dropout, num_levels, num_points)
            for _ in range(dec_layers)
        )
        self.ref_point_head = MLP(2 * hidden_dim, hidden_dim, hidden_dim, 2)
        self.query_feat = nn.Embedding(num_queries * num_groups, hidden_dim)
        # learned reference boxes: offsets from the two-stage proposals (zero: the proposal),
        # or without two-stage the boxes themselves, in inverse-sigmoid space
        self.refpoint_embed = nn.Embedding(num_queries * num_groups, 4)
        self.decoder_norm = nn.LayerNorm(hidden_dim)
        self.class_embed = nn.Linear(hidden_dim, num_classes)
        self.bbox_embed = MLP(hidden_dim, hidden_dim, 4, 3)
        if two_stage:
            self.enc_output = nn.ModuleList(nn.Linear(hidden_dim, hidden_dim) for _ in range(num_groups))
            self.enc_output_norm = nn.ModuleList(nn.LayerNorm(hidden_dim) for _ in range(num_groups))
        self.dn_groups, self.dn_label_noise, self.dn_box_noise = dn_groups, dn_label_noise, dn_box_noise
        if dn_groups:
            self.label_embed = nn.Embedding(num_classes, hidden_dim)  # denoising queries' content
        self.num_keypoints = num_keypoints
        self.keypoint_embed = self.keypoint_neck = None
        if num_keypoints:
            if hidden_dim % keypoint_dim_downscale:
                raise ValueError(
                    f"keypoint_dim_downscale={keypoint_dim_downscale} does not divide hidden_dim={hidden_dim}"
                )
            c = hidden_dim // keypoint_dim_downscale
            self.keypoint_neck = (neck or MultiLevelProjector)(embed_dim, hidden_dim) if keypoint_neck else None
            self.keypoint_query_initializer = ConditionalQueryInitializer(hidden_dim, num_keypoints, c)
            self.keypoint_pos_embed = nn.Parameter(torch.randn(num_keypoints, c))
            self.keypoint_decoder = nn.ModuleList(
                KeypointQueryLayer(
                    hidden_dim,
                    c,
                    num_heads // keypoint_dim_downscale,
                    num_cross_heads // keypoint_dim_downscale,
                    num_levels,
                    num_points,
                    dropout,
                    keypoint_cross_attn,
                )
                for _ in range(dec_layers)
            )
            # (dx, dy, findable, visible, log l11, l21, log l22, class logit) per keypoint query
            self.keypoint_embed = MLP(c, c, KEYPOINT_CHANNELS + 1, 3)
            if two_stage:  # the proposals' keypoint queries, from their selected tokens
                self.keypoint_query_initializer_enc = ConditionalQueryInitializer(hidden_dim, num_keypoints, c)
        self.reset_parameters(prior_prob)

    def reset_parameters(self, prior_prob: float) -> None:
        """RF-DETR's initialisation: Xavier for the decoder's matrices (deformable attention
        keeps its own), the class bias at `prior_prob`, box heads and learned reference offsets
        at zero, the two-stage heads copies of the decoder's."""
        # RF-DETR's transformer initialises all its matrices so, the keypoint queries, their
        # positions and initialisers included (which undoes the initialisers' zero last layer)
        decoder = [self.decoder]
        if self.keypoint_embed is not None:
            decoder += [self.keypoint_decoder, self.keypoint_query_initializer]
            decoder += [self.keypoint_query_initializer_enc] if self.two_stage else []
            nn.init.xavier_uniform_(self.keypoint_pos_embed)
            nn.init.zeros_(self.keypoint_embed.layers[-1].weight)
            nn.init.zeros_(self.keypoint_embed.layers[-1].bias)
        for p in nn.ModuleList(decoder).parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        for module in nn.ModuleList(decoder).modules():
            if isinstance(module, MSDeformAttn):
                module.reset_parameters()
        nn.init.constant_(self.class_embed.bias, -math.log((1 - prior_prob) / prior_prob))
        nn.init.zeros_(self.bbox_embed.layers[-1].weight)
        nn.init.zeros_(self.bbox_embed.layers[-1].bias)
        nn.init.zeros_(self.refpoint_embed.weight)
        if self.two_stage:
            self.enc_out_class_embed = nn.ModuleList(copy.deepcopy(self.class_embed) for _ in range(self.num_groups))
            self.enc_out_bbox_embed = nn.ModuleList(copy.deepcopy(self.bbox_embed) for _ in range(self.num_groups))
            if self.keypoint_embed is not None:  # the proposals' keypoint heads
                self.enc_out_keypoint_embed = nn.ModuleList(
                    copy.deepcopy(self.keypoint_embed) for _ in range(self.num_groups)
                )

    @property
    def denoising(self) -> bool:
        """Whether training needs the targets (denoising queries); the detector then passes them."""
        return self.dn_groups > 0

    def forward(self, features: ViTFeatures, targets: Sequence[BoxTargets] | None = None) -> DetectionOutput:
        """ViTFeatures (with the neck's intermediates) -> `DetectionOutput` with sigmoid
        logits [B, G*Q, K] and boxes [B, G*Q, 4] (cx, cy, w, h) in [0, 1] of each image, the
        earlier layers' in `aux` and the two-stage proposals' in `enc`; G is `num_groups` in
        training and 1 in evaluation. With denoising on, training also takes the targets and
        returns the denoising queries' predictions in `dn`."""
        keypoint_levels = self.keypoint_neck(features) if self.keypoint_neck is not None else None
        return self.decode(self.neck(features), targets, keypoint_levels)

    def decode(
        self,
        feature_levels: FeatureLevels,
        targets: Sequence[BoxTargets] | None = None,
        keypoint_levels: FeatureLevels | None = None,
    ) -> DetectionOutput:
        """The decoder and heads over the neck's levels (see `forward`); the keypoint
        queries sample `keypoint_levels` (the keypoint neck's), else the same levels."""
        levels = FlatLevels.of(feature_levels)
        b = levels.memory.shape[0]
        groups = self.num_groups if self.training else 1
        n = groups * self.num_queries
        tgt = self.query_feat.weight[:n].unsqueeze(0).expand(b, -1, -1)
        learned = self.refpoint_embed.weight[:n].float().unsqueeze(0).expand(b, -1, -1)
        enc = enc_keypoints = None
        if self.two_stage:
            enc_logits, enc_boxes, enc_keypoints = self.select_proposals(levels, groups)
            enc = (enc_logits, enc_boxes)
            # the selected proposals start the decoder (detached); they learn from their own loss
            reference = refine_boxes(enc[1].detach(), learned, self.bbox_reparam)
        else:  # learned boxes, in inverse-sigmoid space (zero: a centred box of half the image)
            reference = learned.sigmoid()
        noised = None
        if self.training and self.dn_groups and targets is not None and any(len(t.labels) for t in targets):
            noised = denoising_queries(
                targets, self.dn_groups, self.num_classes, self.dn_label_noise, self.dn_box_noise, tgt.device
            )
            # the denoising queries go first: content from their class, reference their noised box
            tgt = torch.cat([self.label_embed(noised.labels).to(tgt.dtype), tgt], 1)
            reference = torch.cat([noised.boxes, reference], 1)
            mask = denoising_mask(noised.valid, self.dn_groups, groups, self.num_queries)
            mask = mask.repeat_interleave(self.decoder[0].self_attn.num_heads, 0)
        keypoint_tgt, keypoint_hidden = None, []
        if self.keypoint_embed is not None:
            keypoint_tgt = self.keypoint_query_initializer(tgt)  # [B, N, K, c]
            keypoint_memory = FlatLevels.of(keypoint_levels).memory if keypoint_levels is not None else levels.memory
        hidden, inputs = [], [reference]
        for i, layer in enumerate(self.decoder):
            # with fixed references (RF-DETR's lite refinement) every layer has the same reference
            # points and query positions: computed once, as RF-DETR does
            if i == 0 or self.refine_references:
                scaled = reference[:, :, None] * torch.cat([levels.valid_ratios, levels.valid_ratios], -1)[:, None]
                # the query's position is its box in its own image (RF-DETR embeds the box scaled
                # to the padded map, which makes a query's position depend on the batch's padding)
                query_pos = self.ref_point_head(box_sine_embedding(reference, self.hidden_dim // 2).to(tgt.dtype))
            tgt = layer(tgt, query_pos, scaled, levels, groups, mask if noised is not None else None)
            if keypoint_tgt is not None:
                tgt, keypoint_tgt = self.keypoint_decoder[i](
                    tgt,
                    query_pos,
                    keypoint_tgt,
                    self.keypoint_pos_embed,
                    scaled,
                    keypoint_memory,
                    levels.spatial_shapes,
                    levels.padding,
                )
                keypoint_hidden.append(keypoint_tgt)
            hidden.append(self.decoder_norm(tgt))
            if self.refine_references and i < len(self.decoder) - 1:
                with torch.autocast(tgt.device.type, enabled=False):
                    refined = refine_boxes(reference, self.bbox_embed(tgt.float()), self.bbox_reparam)
                inputs.append(refined)
                reference = refined.detach()
        if not self.refine_references:
            inputs = inputs * len(self.decoder)
        with torch.autocast(tgt.device.type, enabled=False):  # the heads in fp32, as DETRHead's
            hs = torch.stack(hidden).float()  # [L, B, G*Q, d]
            logits = self.class_embed(hs)
            # look-forward-twice (DINO): layer l's box is its delta applied to its input
            # reference before the detach, i.e. to layer l-1's box, whose layer so learns from both
            boxes = torch.stack(
                [refine_boxes(r, self.bbox_embed(h), self.bbox_reparam) for r, h in zip(inputs, hs, strict=True)]
            )
            every_layer = None
            if keypoint_tgt is not None:
                # each layer's keypoints relative to its reference box, as RF-DETR
                delta = self.keypoint_embed(torch.stack(keypoint_hidden).float())  # [L, B, N, K, 8]
                every_layer, logits = keypoint_outputs(delta, torch.stack(inputs), logits)
        dn = None
        if noised is not None:  # split the denoising queries off
            d = noised.labels.shape[1]
            # with keypoints, a denoising query also learns its target's keypoints (its keypoint
            # queries are made from its class's embedding and sample around its noised box)
            dn_keypoints = tuple(every_layer[:, :, :d]) if every_layer is not None else None
            layers = tuple(zip(logits[:, :, :d], boxes[:, :, :d], strict=True))
            dn = Denoising(layers, noised.matches, self.dn_groups, dn_keypoints)
            logits, boxes, hs = logits[:, :, d:], boxes[:, :, d:], hs[:, :, d:]
            every_layer = every_layer[:, :, d:] if every_layer is not None else None
        # (a one-layer decoder has none: zip over an empty slice puts an unbind into zero tensors in
        # an exported graph, which torch.export saves to a .pt2 it cannot load back)
        with_aux = self.aux_loss and len(logits) > 1
        aux = tuple(zip(logits[:-1], boxes[:-1], strict=True)) if with_aux else ()
        keypoints, aux_keypoints = None, ()
        if every_layer is not None:
            keypoints, aux_keypoints = every_layer[-1], tuple(every_layer[:-1]) if with_aux else ()
        return DetectionOutput(
            logits[-1],
            boxes[-1],
            aux,
            groups,
            enc=enc,
            sigmoid=True,
            dn=dn,
            keypoints=keypoints,
            aux_keypoints=aux_keypoints,
            enc_keypoints=enc_keypoints,
        )

    def select_proposals(
        self, levels: FlatLevels, groups: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Two-stage query selection, per group: every valid token's proposal is scored and
        moved by the group's encoder heads, and the Q best (by their highest class logit)
        are kept -> their logits [B, G*Q, K] and boxes [B, G*Q, 4], in fp32, and with a
        keypoint head their keypoints [B, G*Q, K', 7] relative to their boxes (else None)."""
        anchors, valid = token_proposals(levels)
        tokens = valid.shape[1]
        if tokens < self.num_queries:
            raise ValueError(
                f"two-stage selection needs at least num_queries={self.num_queries} tokens, the levels have {tokens}: "
                "lower num_queries or feed larger images"
            )
        memory = levels.memory.masked_fill(~valid[..., None], 0.0)
        logits, boxes, keypoints = [], [], []
        for g in range(groups):
            out = self.enc_output_norm[g](self.enc_output[g](memory))
            with torch.autocast(out.device.type, enabled=False):
                out = out.float()
                group_logits = self.enc_out_class_embed[g](out)  # [B, S, K]
                score = group_logits.detach().amax(-1).masked_fill(~valid, float("-inf"))
                top = score.topk(self.num_queries, dim=1).indices  # [B, Q]
                logits.append(group_logits.gather(1, top[..., None].expand(-1, -1, group_logits.shape[-1])))
                # the box MLP acts per token: run it on the Q selected tokens only, not on all S (the
                # same boxes and gradients; rfdetr does the same, and S is 1600 at RF-DETR-B's 560 px)
                selected = out.gather(1, top[..., None].expand(-1, -1, out.shape[-1]))
                anchor = anchors.gather(1, top[..., None].expand(-1, -1, 4))
                boxes.append(refine_boxes(anchor, self.enc_out_bbox_embed[g](selected), self.bbox_reparam))
                if self.keypoint_embed is not None:
                    delta = self.enc_out_keypoint_embed[g](self.keypoint_query_initializer_enc(selected))
                    group_keypoints, logits[-1] = keypoint_outputs(delta, boxes[-1], logits[-1])
                    keypoints.append(group_keypoints)
        return torch.cat(logits, 1), torch.cat(boxes, 1), torch.cat(keypoints, 1) if keypoints else None


def keypoint_outputs(
    delta: torch.Tensor, references: torch.Tensor, logits: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A keypoint MLP's outputs delta [..., N, K, 8] for queries with reference boxes
    references [..., N, 4] and class logits [..., N, C] -> keypoints [..., N, K, 7] placed
    relative to the reference boxes, and the logits with each query's keypoints' class channel
    summed into every class (RF-DETR's `_aggregate_keypoint_class_logits` for one schema).

    A non-finite output is zeroed first (as RF-DETR): the placement multiplies it by the box
    size, and 0 * nan would reach the box head's gradient."""
    delta = delta.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    return place_keypoints(delta, references), logits + delta[..., KEYPOINT_CHANNELS].sum(-1, keepdim=True)


def from_rf_detr(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """RF-DETR's (and LW-DETR's) decoder and heads in `LWDETRHead`'s names: an `LWDETR`
    state dict (its `model` entry of a checkpoint) -> the keys of `LWDETRHead` except the
    necks. Backbone and projector keys are left out: RF-DETR's DINOv2 and projectors are not
    vitdense's modules. A keypoint model's GroupPose stream maps to `keypoint_decoder` (its
    inter-instance keypoint attention, off in RF-DETR's preview, has no counterpart here)."""
    renamed = {}
    for key, value in state_dict.items():
        if key.startswith("transformer.decoder.bbox_embed."):
            continue  # the same module as `bbox_embed`, listed twice
        if key.endswith("keypoint_class_mask"):  # blocks attention between classes' keypoints
            if value.any():
                raise ValueError(f"{key}: keypoints per class are not supported by LWDETRHead (one schema for all)")
            continue
        if ".inter_inst_kp_" in key:
            raise ValueError(f"{key}: RF-DETR's inter-instance keypoint attention is not supported by LWDETRHead")
        key = key.replace("transformer.decoder.keypoint_pos_embed", "keypoint_pos_embed")
        parts = key.split(".")
        if key.startswith("transformer.decoder.layers.") and parts[4] in KEYPOINT_LAYER_KEYS:
            key = ".".join(["keypoint_decoder", parts[3], KEYPOINT_LAYER_KEYS[parts[4]], *parts[5:]])
        key = key.replace("transformer.decoder.layers.", "decoder.")
        key = key.replace("transformer.decoder.norm.", "decoder_norm.")
        key = key.replace("transformer.decoder.ref_point_head.", "ref_point_head.")
        key = key.removeprefix("transformer.")
        if key.split(".")[0] in LWDETR_KEYS:
            renamed[key] = value
    return renamed


#: RF-DETR's names in a decoder layer's keypoint stream -> `KeypointQueryLayer`'s
KEYPOINT_LAYER_KEYS = {
    "inst_in_proj": "in_proj",
    "inst_pos_in_proj": "pos_in_proj",
    "inst_out_proj": "out_proj",
    "memory_in_proj": "memory_in_proj",
    "kp_inst_self_attn": "self_attn",
    "kp_inst_norm": "instance_norm",
    "kp_norm": "norm1",
    "kp_cross_attn": "cross_attn",
    "kp_cross_attn_norm": "norm2",
    "kp_linear1": "linear1",
    "kp_linear3": "linear2",
    "kp_norm5": "norm3",
    "instance_kp_layer_scale": "layer_scale",
}

#: the top-level names of `LWDETRHead`'s modules that RF-DETR also has
LWDETR_KEYS = {
    "decoder",
    "decoder_norm",
    "ref_point_head",
    "query_feat",
    "refpoint_embed",
    "class_embed",
    "bbox_embed",
    "enc_output",
    "enc_output_norm",
    "enc_out_class_embed",
    "enc_out_bbox_embed",
    "keypoint_decoder",
    "keypoint_pos_embed",
    "keypoint_query_initializer",
    "keypoint_query_initializer_enc",
    "keypoint_embed",
    "enc_out_keypoint_embed",
}
