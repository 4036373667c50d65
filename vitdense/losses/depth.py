"""Monocular depth losses: the scale-invariant log loss of metric depth (BTS, AdaBins,
Depth Anything's metric models) and MiDaS's scale- and shift-invariant loss of relative
depth (disparity up to an unknown scale and shift).

Both are plain nn.Modules over [B, H, W] maps and a bool mask [B, H, W] of the pixels with
ground truth. They run in fp32 under any autocast (bf16 has 8 bits of mantissa: a log-depth
difference of 1% is below its step at log(10 m) = 2.3) and return an fp32 scalar. Pixels
outside the mask count nothing, whatever they hold (0, inf, NaN), and get no gradient; a
batch without a valid pixel gives 0 (still connected to the prediction's graph, so that
every process of a distributed step runs the same backward).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn


def _check(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, name: str) -> None:
    if pred.dim() != 3 or pred.shape != target.shape or pred.shape != mask.shape:
        raise ValueError(
            f"{name}: prediction, target and mask must all be [B, H, W]; got {tuple(pred.shape)}, "
            f"{tuple(target.shape)} and {tuple(mask.shape)} (squeeze a channel dimension of 1 first)"
        )
    if mask.dtype != torch.bool:
        raise ValueError(f"{name}: mask must be a bool tensor (True where the target is valid), got {mask.dtype}")


def _safe_sqrt(x: torch.Tensor) -> torch.Tensor:
    """sqrt(max(x, 0)) with a zero gradient at x <= 0: at a perfect prediction both the
    value and the gradient of the SILog loss are 0, where sqrt's gradient would be inf * 0 = NaN
    (and rounding can leave mean(d^2) - mean(d)^2 a hair below 0)."""
    positive = x > 0
    return torch.where(positive, torch.where(positive, x, torch.ones_like(x)).sqrt(), torch.zeros_like(x))


class SILogLoss(nn.Module):
    """Scale-invariant log loss (Eigen et al., NeurIPS 2014, in BTS's form, which AdaBins
    and Depth Anything's metric fine-tuning use):

        d = log(pred) - log(target) over the valid pixels
        loss = scale * sqrt(mean(d^2) - variance_focus * mean(d)^2)

    As BTS's `silog_loss`, the means run over the batch's valid pixels jointly (an image
    with more valid pixels weighs more; a batch is one sample of the formula), not per image
    then averaged. variance_focus = 1 makes the loss blind to a global scale of the
    prediction (the variance of d); 0.85 keeps 15% of the squared mean log error, so that
    absolute scale is learned too.

    Args:
        variance_focus: lambda above, in [0, 1].
        scale: the factor in front (BTS's 10).
        eps: predictions are clamped to at least eps before the log (a ReLU head at 0 would
            give -inf; below eps the gradient is 0, so keep the head's output positive).
    """

    #: what it compares: metric depth (`DepthTask` reads this)
    space: ClassVar[str] = "depth"

    def __init__(self, variance_focus: float = 0.85, scale: float = 10.0, eps: float = 1e-6) -> None:
        super().__init__()
        if not 0.0 <= variance_focus <= 1.0:
            raise ValueError(f"SILogLoss: variance_focus must be in [0, 1] (the loss is a sqrt), got {variance_focus}")
        self.variance_focus = variance_focus
        self.scale = scale
        self.eps = eps

    def forward(self, pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """pred, target: [B, H, W] metric depths (target > 0 where mask); mask: [B, H, W] bool.
        Returns an fp32 scalar."""
        _check(pred, target, mask, "SILogLoss")
        with torch.autocast(pred.device.type, enabled=False):
            pred, target = pred.float(), target.float()
            # the log of a masked-out pixel is never taken (a 0 or NaN target would poison the gradient)
            log_p = torch.where(mask, pred.clamp(min=self.eps), torch.ones_like(pred)).log()
            log_t = torch.where(mask, target, torch.ones_like(target)).log()
            d = (log_p - log_t) * mask  # [B, H, W], 0 outside the mask
            n = mask.sum().clamp(min=1)
            mean_d = d.sum() / n
            # mean(d^2) - lambda mean(d)^2 written as var(d) + (1 - lambda) mean(d)^2, the
            # variance taken about the mean: the raw difference of two fp32 means cancels
            # (pred = 2 target with lambda = 1 would give 2e-3, not 0)
            centred = (d - mean_d) * mask
            variance = (centred * centred).sum() / n
            return self.scale * _safe_sqrt(variance + (1 - self.variance_focus) * mean_d * mean_d)


def compute_scale_and_shift(
    pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per image, the least-squares (s, t) minimising sum over valid pixels of (s * pred + t - target)^2,
    the closed-form solution of the 2 x 2 normal equations, as MiDaS's `compute_scale_and_shift`.

    Args:
        pred, target: [B, H, W] fp32, already 0 outside the mask.
        mask: [B, H, W] bool.

    Returns:
        scale, shift: [B] each; (0, 0) for an image whose system is singular (no valid pixel,
        or a constant prediction over them), as MiDaS's (there det == 0 exactly; here also a
        prediction constant up to fp32 rounding).
    """
    # With n = sum(mask), the normal equations [[sum p^2, sum p], [sum p, n]] [s, t] = [sum p t, sum t]
    # solve to s = sum (p - mean p)(t - mean t) / sum (p - mean p)^2, t = mean t - s mean p: MiDaS's
    # solution, with the sums taken about the means (MiDaS's det = n sum p^2 - (sum p)^2 cancels in
    # fp32 when the prediction's spread is small against its offset: 5e-5 of loss left at a perfect fit)
    n = mask.sum((1, 2)).float()
    n_safe = n.clamp(min=1)[:, None, None]
    pred_c = (pred - pred.sum((1, 2), keepdim=True) / n_safe) * mask
    target_c = (target - target.sum((1, 2), keepdim=True) / n_safe) * mask
    var = (pred_c * pred_c).sum((1, 2))
    # a prediction constant over the image up to rounding (spread below 1e-6 of its magnitude)
    # has no scale to fit; the rounding would pass for one and give s ~ 1e9
    solvable = var > 1e-12 * (pred * pred).sum((1, 2))
    var = torch.where(solvable, var, torch.ones_like(var))  # no 0/0 in the graph of a singular image
    scale = torch.where(solvable, (pred_c * target_c).sum((1, 2)) / var, torch.zeros_like(var))
    shift = torch.where(
        solvable, (target.sum((1, 2)) - scale * pred.sum((1, 2))) / n.clamp(min=1), torch.zeros_like(var)
    )
    return scale, shift


class ScaleShiftInvariantLoss(nn.Module):
    """MiDaS's scale- and shift-invariant loss (Ranftl et al., "Towards Robust Monocular
    Depth Estimation: Mixing Datasets for Zero-shot Cross-dataset Transfer", TPAMI 2020:
    L_ssimse + alpha * L_reg), in disparity space.

    Per image, the prediction is aligned to the target by the least-squares scale and shift
    over its valid pixels (`compute_scale_and_shift`; gradients flow through s and t), and
    with R = s * pred + t - target over the valid pixels:

        data = sum_B sum_valid R^2 / (2 * M)      M = the batch's valid pixels
        reg = sum_{k < scales} sum_B sum (|dx R^k| + |dy R^k|) / M^k
        loss = data + alpha * reg

    where R^k is R subsampled with stride 2^k (`R[:, ::2**k, ::2**k]`), the finite differences
    are taken between horizontally or vertically adjacent pixels that are both valid, and M^k
    counts the valid pixels at that stride. Both terms are 'batch-based' (summed over the batch,
    divided by the batch's valid pixel count). This follows the paper and its authors' released
    loss (gist dvdhfnr/732c26b61a0e63a0abc8a5d769dbebd0, linked from isl-org/MiDaS's issues;
    MSELoss, GradientLoss and ScaleAndShiftInvariantLoss with reduction='batch-based'), whose
    numbers the tests reproduce; the paper's "trimmed" variant is not implemented.

    Args:
        alpha: weight of the multi-scale gradient matching term (MiDaS's 0.5).
        scales: levels of the gradient matching term (MiDaS's 4).
    """

    #: what it compares: inverse depth (disparity), so `DepthTask` trains relative depth with it
    space: ClassVar[str] = "disparity"

    def __init__(self, alpha: float = 0.5, scales: int = 4) -> None:
        super().__init__()
        if scales < 1:
            raise ValueError(f"ScaleShiftInvariantLoss: scales must be >= 1, got {scales}")
        self.alpha = alpha
        self.scales = scales

    def forward(self, pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """pred: [B, H, W] predicted disparity (any scale and shift); target: [B, H, W]
        disparity (inverse depth, any scale: convert a depth target with 1 / depth where valid);
        mask: [B, H, W] bool. Returns an fp32 scalar."""
        _check(pred, target, mask, "ScaleShiftInvariantLoss")
        with torch.autocast(pred.device.type, enabled=False):
            zero = torch.zeros((), device=pred.device)
            pred = torch.where(mask, pred.float(), zero)
            target = torch.where(mask, target.float(), zero)
            scale, shift = compute_scale_and_shift(pred, target, mask)
            residual = torch.where(mask, scale[:, None, None] * pred + shift[:, None, None] - target, zero)
            loss = (residual * residual).sum() / (2 * mask.sum().clamp(min=1))
            if self.alpha > 0:
                loss = loss + self.alpha * sum(
                    _gradient_matching(residual[:, :: 2**k, :: 2**k], mask[:, :: 2**k, :: 2**k])
                    for k in range(self.scales)
                )
            return loss


def _gradient_matching(residual: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum of |R(x+1) - R(x)| and |R(y+1) - R(y)| over pairs of valid neighbours, over the
    batch's valid pixels (at this stride). residual: [B, h, w], 0 outside mask [B, h, w]."""
    pairs_x = mask[:, :, 1:] & mask[:, :, :-1]
    pairs_y = mask[:, 1:, :] & mask[:, :-1, :]
    grad_x = (residual[:, :, 1:] - residual[:, :, :-1]).abs() * pairs_x
    grad_y = (residual[:, 1:, :] - residual[:, :-1, :]).abs() * pairs_y
    return (grad_x.sum() + grad_y.sum()) / mask.sum().clamp(min=1)
