"""Segmentation's per-pixel cross-entropy, computed as one pass over [pixels, K] rows.

`F.cross_entropy` on [B, K, H, W] logits reduces over dim 1; on Segmenter's upsampled
logits (channels-last: the decoders emit [B, N, K]) torch's CPU kernel runs that reduction
strided, and its backward materialises a zero gradient, scatters -1 into it and runs the
log-softmax backward over it: three passes over a [B, H, W, K] tensor (315 MB at 512 x 512,
150 classes, batch 2). `pixel_cross_entropy` reads the logits as contiguous rows and its
backward is one exp over the saved log-probabilities, a scatter and a scale. Same loss and
gradient as `F.cross_entropy(..., reduction="sum")` up to float rounding (tested).
"""

from __future__ import annotations

import torch
from torch.autograd.function import FunctionCtx


class _RowCrossEntropy(torch.autograd.Function):
    """Sum over rows of weight[t] * (logsumexp(x) - x[t]), rows with t == ignore_index left out."""

    @staticmethod
    def forward(
        ctx: FunctionCtx, logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, ignore_index: int
    ) -> torch.Tensor:
        log_probs = torch.log_softmax(logits, dim=1)  # [P, K]
        labelled = target != ignore_index
        classes = target.masked_fill(~labelled, 0)[:, None]  # [P, 1], any class on ignored rows
        row_weight = labelled.to(logits.dtype) if weight is None else weight[classes[:, 0]] * labelled
        ctx.save_for_backward(log_probs, classes, row_weight)
        ctx.used = False
        return -(log_probs.gather(1, classes)[:, 0] * row_weight).sum()

    @staticmethod
    def backward(ctx: FunctionCtx, grad_loss: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        if ctx.used:
            raise RuntimeError("pixel_cross_entropy's backward reuses its saved tensors: it runs once per forward")
        ctx.used = True
        log_probs, classes, row_weight = ctx.saved_tensors
        # d/dx = weight[t] * (softmax(x) - onehot(t)), written over the saved log-probabilities
        # (not needed again) so that no second [P, K] tensor is allocated
        grad = log_probs.exp_()
        grad.scatter_add_(1, classes, grad.new_full(classes.shape, -1.0))
        return grad.mul_((row_weight * grad_loss)[:, None]), None, None, None


def pixel_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None, ignore_index: int = 255
) -> torch.Tensor:
    """Summed cross-entropy of every labelled pixel.

    Args:
        logits: [B, K, H, W], any dtype (computed in fp32); channels-last memory (what
            `vitdense.models.Segmenter` returns) is read without a copy.
        target: [B, H, W] class indices; `ignore_index` pixels count nothing.
        weight: [K] class weights (as `F.cross_entropy`'s), or None.

    Returns:
        The scalar sum over labelled pixels of weight[t] * -log softmax(logits)[t], equal to
        `F.cross_entropy(logits, target, weight, ignore_index=ignore_index, reduction="sum")`.
    """
    k = logits.shape[1]
    rows = logits.float().movedim(1, -1).reshape(-1, k)  # a view for channels-last logits
    return _RowCrossEntropy.apply(rows, target.reshape(-1), weight, ignore_index)
