"""The designs `python -m vitdense.bench train-step` measures vitdense against: what a user
would otherwise run for each task, written from the papers and the reference code's
structure (not copied), on timm's ViT with the same weights as vitdense's backbone.

- classification: timm's `VisionTransformer` with its head, cross-entropy.
- segmentation: Segmenter's design (Strudel et al. 2021): the ViT and the mask transformer
  with attention computed explicitly (softmax(QK^T)V, as Segmenter's code does), bilinear
  upsampling of the masks to the image, cross-entropy.
- detection: DETR's design (Carion et al. 2020): patch tokens projected to the decoder
  width, 2D sine positions, a 6-layer post-norm decoder of `nn.MultiheadAttention` in
  sequence-first layout with the query and position embeddings added in every layer, a
  Hungarian matcher over the batch's cost matrix split per image, and the set criterion
  (cross-entropy with the "no object" weight, L1 and GIoU, every layer).

Each is `step(images [B, 3, H, W], targets) -> loss` for the benchmark, not a library API.
"""

from __future__ import annotations

import math
from functools import partial

import timm
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment
from torch import nn
from torchvision.ops import box_convert, generalized_box_iou


def explicit_attention(model: nn.Module) -> nn.Module:
    """Make every timm attention layer of `model` compute softmax(QK^T)V explicitly."""
    for module in model.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = False
    return model


class SegmenterPeer(nn.Module):
    """Segmenter's ViT + mask transformer (d_model = D, D/64 heads, 4x MLP, `depth` blocks,
    dropout 0.1 as vitdense's default segmentation head and Segmenter's configs)."""

    def __init__(self, vit: nn.Module, num_classes: int, depth: int = 2, dropout: float = 0.1) -> None:
        super().__init__()
        self.vit = explicit_attention(vit)
        dim = vit.embed_dim
        self.patch_size = vit.patch_embed.patch_size[0]
        self.num_prefix = vit.num_prefix_tokens
        self.proj_dec = nn.Linear(dim, dim)
        self.cls_emb = nn.Parameter(torch.randn(1, num_classes, dim) * 0.02)
        # Segmenter's decoder blocks drop out 0.1 of the attention weights, the attention's
        # output and both FFN activations: timm's attn_drop and proj_drop (its MLP's drop)
        block = partial(timm.models.vision_transformer.Block, dim, dim // 64, proj_drop=dropout, attn_drop=dropout)
        self.blocks = nn.Sequential(*(block() for _ in range(depth)))
        explicit_attention(self.blocks)
        self.decoder_norm = nn.LayerNorm(dim)
        self.proj_patch = nn.Parameter(torch.randn(dim, dim) * dim**-0.5)
        self.proj_classes = nn.Parameter(torch.randn(dim, dim) * dim**-0.5)
        self.mask_norm = nn.LayerNorm(num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """images [B, 3, H, W] -> logits [B, K, H, W]."""
        b, _, h, w = images.shape
        gh, gw = h // self.patch_size, w // self.patch_size
        tokens = self.vit.forward_features(images)[:, self.num_prefix :]
        x = torch.cat([self.proj_dec(tokens), self.cls_emb.expand(b, -1, -1)], 1)
        x = self.decoder_norm(self.blocks(x))
        patches, classes = x[:, : gh * gw] @ self.proj_patch, x[:, gh * gw :] @ self.proj_classes
        patches, classes = F.normalize(patches, dim=-1), F.normalize(classes, dim=-1)
        masks = self.mask_norm(patches @ classes.transpose(1, 2))  # [B, N, K]
        masks = masks.transpose(1, 2).reshape(b, -1, gh, gw)
        return F.interpolate(masks, size=(h, w), mode="bilinear", align_corners=False)

    def step(self, images: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self(images).float(), masks, ignore_index=255)


def sine_positions(h: int, w: int, dim: int, device: torch.device) -> torch.Tensor:
    """DETR's 2D sine position encoding of an unpadded h x w grid -> [h * w, dim]."""
    half = dim // 2
    y = torch.arange(1, h + 1, device=device, dtype=torch.float32)[:, None].expand(h, w) / h * 2 * math.pi
    x = torch.arange(1, w + 1, device=device, dtype=torch.float32)[None, :].expand(h, w) / w * 2 * math.pi
    freq = 10000 ** (2 * (torch.arange(half, device=device) // 2) / half)
    py, px = y[..., None] / freq, x[..., None] / freq
    py = torch.stack([py[..., 0::2].sin(), py[..., 1::2].cos()], -1).flatten(2)
    px = torch.stack([px[..., 0::2].sin(), px[..., 1::2].cos()], -1).flatten(2)
    return torch.cat([py, px], -1).flatten(0, 1)


class DETRDecoderLayerPeer(nn.Module):
    """DETR's post-norm decoder layer, sequence-first: [Q, B, d]."""

    def __init__(self, d: int, heads: int, ffn: int, dropout: float) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d, heads, dropout=dropout)
        self.cross_attn = nn.MultiheadAttention(d, heads, dropout=dropout)
        self.ffn = nn.Sequential(nn.Linear(d, ffn), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ffn, d))
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(3))
        self.dropout = nn.Dropout(dropout)

    def forward(self, tgt: torch.Tensor, memory: torch.Tensor, pos: torch.Tensor, query_pos: torch.Tensor):
        q = k = tgt + query_pos
        tgt = self.norms[0](tgt + self.dropout(self.self_attn(q, k, tgt)[0]))
        tgt = self.norms[1](tgt + self.dropout(self.cross_attn(tgt + query_pos, memory + pos, memory)[0]))
        return self.norms[2](tgt + self.dropout(self.ffn(tgt)))


class DETRPeer(nn.Module):
    """DETR's head and criterion on the ViT's patch tokens (matcher costs 1/5/2, loss
    weights 1/5/2, "no object" weight 0.1, auxiliary losses on every layer)."""

    def __init__(
        self,
        vit: nn.Module,
        num_classes: int,
        num_queries: int = 100,
        d: int = 256,
        layers: int = 6,
        heads: int = 8,
        ffn: int = 2048,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.vit, self.num_classes, self.d = vit, num_classes, d
        self.patch_size = vit.patch_embed.patch_size[0]
        self.num_prefix = vit.num_prefix_tokens
        self.input_proj = nn.Linear(vit.embed_dim, d)
        self.query_embed = nn.Embedding(num_queries, d)
        self.layers = nn.ModuleList(DETRDecoderLayerPeer(d, heads, ffn, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.class_embed = nn.Linear(d, num_classes + 1)
        self.bbox_embed = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d), nn.ReLU(), nn.Linear(d, 4))
        weight = torch.ones(num_classes + 1)
        weight[-1] = 0.1
        self.register_buffer("empty_weight", weight)

    def forward(self, images: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """images [B, 3, H, W] -> per decoder layer (logits [B, Q, K + 1], boxes [B, Q, 4] cxcywh)."""
        b, _, h, w = images.shape
        tokens = self.vit.forward_features(images)[:, self.num_prefix :]
        memory = self.input_proj(tokens).transpose(0, 1)  # [N, B, d]
        pos = sine_positions(h // self.patch_size, w // self.patch_size, self.d, images.device)[:, None]
        query_pos = self.query_embed.weight[:, None].expand(-1, b, -1)
        tgt = torch.zeros_like(query_pos)
        outputs = []
        for layer in self.layers:
            tgt = layer(tgt, memory, pos, query_pos)
            hidden = self.norm(tgt).transpose(0, 1)
            outputs.append((self.class_embed(hidden), self.bbox_embed(hidden).sigmoid()))
        return outputs

    @torch.no_grad()
    def match(self, logits: torch.Tensor, boxes: torch.Tensor, targets: list[tuple[torch.Tensor, torch.Tensor]]):
        """DETR's matcher: one cost matrix over the batch, split per image, scipy per image."""
        b, q = logits.shape[:2]
        prob = logits.flatten(0, 1).softmax(-1)
        out_boxes = boxes.flatten(0, 1)
        labels = torch.cat([t[1] for t in targets])
        tgt_boxes = torch.cat([t[0] for t in targets])
        cost = (
            5 * torch.cdist(out_boxes, tgt_boxes, p=1)
            - prob[:, labels]
            - 2
            * generalized_box_iou(box_convert(out_boxes, "cxcywh", "xyxy"), box_convert(tgt_boxes, "cxcywh", "xyxy"))
        )
        cost = cost.view(b, q, -1).cpu()
        sizes = [len(t[1]) for t in targets]
        pairs = [linear_sum_assignment(c[i]) for i, c in enumerate(cost.split(sizes, -1))]
        return [(torch.as_tensor(i, dtype=torch.int64), torch.as_tensor(j, dtype=torch.int64)) for i, j in pairs]

    def loss(
        self,
        logits: torch.Tensor,
        boxes: torch.Tensor,
        targets: list[tuple[torch.Tensor, torch.Tensor]],
        num_boxes: int,
    ) -> torch.Tensor:
        """One layer's weighted loss: cross-entropy + 5 L1 + 2 GIoU over the matched boxes."""
        logits, boxes = logits.float(), boxes.float()
        matches = self.match(logits, boxes, targets)
        batch = torch.cat([torch.full_like(src, i) for i, (src, _) in enumerate(matches)])
        src = torch.cat([s for s, _ in matches])
        classes = torch.full(logits.shape[:2], self.num_classes, dtype=torch.int64, device=logits.device)
        classes[batch, src] = torch.cat([t[1][j] for t, (_, j) in zip(targets, matches, strict=True)])
        loss_ce = F.cross_entropy(logits.transpose(1, 2), classes, self.empty_weight)
        matched = boxes[batch, src]
        target = torch.cat([t[0][j] for t, (_, j) in zip(targets, matches, strict=True)])
        loss_bbox = F.l1_loss(matched, target, reduction="sum") / num_boxes
        giou = generalized_box_iou(box_convert(matched, "cxcywh", "xyxy"), box_convert(target, "cxcywh", "xyxy"))
        loss_giou = (1 - torch.diag(giou)).sum() / num_boxes
        return loss_ce + 5 * loss_bbox + 2 * loss_giou

    def step(self, images: torch.Tensor, targets: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        num_boxes = max(sum(len(t[1]) for t in targets), 1)
        return sum(self.loss(logits, boxes, targets, num_boxes) for logits, boxes in self(images))
