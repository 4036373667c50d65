"""The numbers behind the ViT paper's pictures of what a ViT learns (Dosovitskiy et al.,
section 4.5 and appendix D.7), computed from a backbone's own tensors. Plain functions of
tensors; `vitdense.viz.figures` draws them and `python -m vitdense.viz` runs them on a
checkpoint."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from vitdense.backbone.pos_embed import GridSize

HeadFusion = Literal["mean", "max", "min"]


def fuse_heads(attention: torch.Tensor, head: int | HeadFusion = "mean") -> torch.Tensor:
    """[B, heads, ...] -> [B, ...] (e.g. attention [B, heads, T, T] -> [B, T, T]): one
    head's, or the heads' mean, max or min."""
    if isinstance(head, int):
        if not -attention.shape[1] <= head < attention.shape[1]:
            raise ValueError(f"head {head} is out of range for {attention.shape[1]} heads")
        return attention[:, head]
    if head == "mean":
        return attention.mean(1)
    if head == "max":
        return attention.amax(1)
    if head == "min":
        return attention.amin(1)
    raise ValueError(f"head={head!r}: expected a head index, 'mean', 'max' or 'min'")


def cls_attention(attention: torch.Tensor, num_prefix_tokens: int, grid: GridSize) -> torch.Tensor:
    """How much the class token (token 0) attends to each patch.

    attention: [B, heads, T, T] softmax attention (T = P + h * w) -> [B, heads, h, w].
    """
    if num_prefix_tokens < 1:
        raise ValueError("the model has no class token (global-pool models): no class-token attention to show")
    b, heads = attention.shape[:2]
    return attention[:, :, 0, num_prefix_tokens:].reshape(b, heads, *grid)


def attention_rollout(
    attentions: Sequence[torch.Tensor], head_fusion: HeadFusion = "mean", residual: bool = True
) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema, ACL 2020): how much each token's final
    representation draws on each input token, through all layers.

    Each layer's attention is fused over heads; with `residual`, the identity is added
    (the skip connection carries the token itself) and rows are renormalised to sum to 1
    (that is, 0.5 A + 0.5 I); the layers' matrices are then multiplied, last layer on the
    left: R = A_L ... A_2 A_1.

    attentions: per layer, first to last, [B, heads, T, T] -> [B, T, T].
    """
    rollout = None
    for attention in attentions:
        # at least fp32 (bf16 products drift over many layers); fp64 stays fp64
        a = fuse_heads(attention.to(torch.promote_types(attention.dtype, torch.float32)), head_fusion)
        if residual:
            a = a + torch.eye(a.shape[-1], device=a.device)
            a = a / a.sum(-1, keepdim=True)
        rollout = a if rollout is None else a @ rollout
    if rollout is None:
        raise ValueError("attention_rollout needs the attention of at least one layer")
    return rollout


def patch_centres(grid: GridSize, patch_size: tuple[int, int]) -> torch.Tensor:
    """[h * w, 2] (y, x) pixel coordinates of the patches' centres, row-major."""
    ys = (torch.arange(grid[0], dtype=torch.float64) + 0.5) * patch_size[0]
    xs = (torch.arange(grid[1], dtype=torch.float64) + 0.5) * patch_size[1]
    return torch.cartesian_prod(ys, xs)


def mean_attention_distance(
    attention: torch.Tensor, num_prefix_tokens: int, grid: GridSize, patch_size: tuple[int, int]
) -> torch.Tensor:
    """Mean attention distance of each head (the paper's Figure 7, right, and Figure 11):
    the distance in pixels between a query patch and the patches it attends to, weighted
    by the attention, averaged over query patches and images.

    Only patch-to-patch attention has a distance: prefix tokens (class, registers) are
    left out, and each query's weights over the patches are renormalised to sum to 1, so
    that a head attending mostly to the class token is not counted as local.

    attention: [B, heads, T, T] softmax attention of one layer -> [heads] pixels.
    """
    p = num_prefix_tokens
    weights = attention[:, :, p:, p:].double()
    weights = weights / weights.sum(-1, keepdim=True).clamp_min(1e-12)
    centres = patch_centres(grid, patch_size).to(attention.device)
    distance = torch.cdist(centres, centres)  # [N, N]
    return (weights * distance).sum(-1).mean((0, 2))


def pos_embed_similarity(patch_pos: torch.Tensor, grid: GridSize) -> torch.Tensor:
    """Cosine similarity of each patch's position embedding with every other's (the
    paper's Figure 7, centre).

    patch_pos: [h * w, D] (prefix tokens' entries removed) -> [h, w, h, w]: entry
    [i, j] is the map of position (i, j)'s similarity to every position.
    """
    unit = torch.nn.functional.normalize(patch_pos.float(), dim=-1)
    return (unit @ unit.T).reshape(*grid, *grid)


def filter_components(weight: torch.Tensor, num_components: int = 28) -> tuple[torch.Tensor, torch.Tensor]:
    """Principal components of the patch-embedding filters (the paper's Figure 7, left).

    weight: [D, C, P, P] (the patch embedding's convolution) -> components
    [k, C, P, P] (unit norm, by decreasing variance) and the share of the variance each
    explains [k]. The D filters are the samples, each a C * P * P vector; they are
    centred before the decomposition.
    """
    d = weight.shape[0]
    samples = weight.detach().reshape(d, -1).double()
    samples = samples - samples.mean(0, keepdim=True)
    _, singular, basis = torch.linalg.svd(samples, full_matrices=False)
    k = min(num_components, basis.shape[0])
    variance = singular**2
    return basis[:k].reshape(k, *weight.shape[1:]).float(), (variance[:k] / variance.sum()).float()
