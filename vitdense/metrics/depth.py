"""Monocular depth metrics as the depth literature reports them (Eigen et al. 2014, and the
evaluation protocols of BTS, AdaBins, ZoeDepth and Depth Anything): each image's errors over
its valid pixels, then the mean over images."""

from __future__ import annotations

from typing import Literal

import torch
from torchmetrics import Metric
from torchmetrics.utilities import rank_zero_warn

#: the names `DepthMetrics.compute` returns, in this order
DEPTH_METRIC_NAMES = ("d1", "d2", "d3", "abs_rel", "sq_rel", "rmse", "rmse_log", "log10", "silog")

#: Eigen et al.'s crop of NYU Depth v2's 480 x 640 images (the border without Kinect depth): rows, cols
EIGEN_CROP = (slice(45, 471), slice(41, 601))


def garg_crop(height: int, width: int) -> tuple[slice, slice]:
    """Garg et al.'s crop of KITTI (ECCV 2016): rows 40.8% to 99.2%, cols 3.6% to 96.4% of the image."""
    return (
        slice(int(0.40810811 * height), int(0.99189189 * height)),
        slice(int(0.03594771 * width), int(0.96405229 * width)),
    )


class DepthMetrics(Metric):
    """δ1, δ2, δ3, AbsRel, SqRel, RMSE, RMSE log, log10 and SILog of metric depth maps.

    Per image, over its valid pixels (min_depth < target < max_depth, finite, and inside the
    crop), with the prediction clamped to [min_depth, max_depth] (NaN to min_depth, +inf to
    max_depth, as the depth evaluation scripts do), p the prediction and t the target:

        d{k}     = mean(max(p / t, t / p) < 1.25^k)      k = 1, 2, 3
        abs_rel  = mean(|p - t| / t)
        sq_rel   = mean((p - t)^2 / t)
        rmse     = sqrt(mean((p - t)^2))
        rmse_log = sqrt(mean((log p - log t)^2))
        log10    = mean(|log10 p - log10 t|)
        silog    = 100 * sqrt(mean(e^2) - mean(e)^2)     e = log p - log t

    then each is averaged over images ("each image, then the mean", as Eigen's protocol and
    its successors' evaluations; not a pooled mean over the dataset's pixels). The states are
    float64 sums of the per-image values and an image count, added over processes, so that
    any split of the images over processes or batches gives the same numbers.

    An image with no valid pixel is left out of the mean (it has no error to average) and
    counted in the `skipped` state; `compute` warns with the count (over every process).
    With no image counted at all, every figure is NaN.

    Args:
        min_depth, max_depth: the valid range of the target, bounds excluded (NYU: 1e-3, 10;
            KITTI: 1e-3, 80).
        crop: "eigen" (NYU's rows 45:471, cols 41:601; only for 480 x 640 maps), "garg"
            (KITTI's fractions of any size) or "none".

    `update(preds, targets)`: [B, H, W] tensors, or lists of [H, W] tensors (images of
    different sizes); a prediction of each target's size (resize it first).
    `compute()` -> dict of scalars named as `DEPTH_METRIC_NAMES`.
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = None  # δ's higher, errors lower

    def __init__(
        self,
        min_depth: float = 1e-3,
        max_depth: float = 10.0,
        crop: Literal["none", "eigen", "garg"] = "none",
    ) -> None:
        super().__init__()
        if crop not in ("none", "eigen", "garg"):
            raise ValueError(f"DepthMetrics: crop must be 'none', 'eigen' or 'garg', got {crop!r}")
        if not 0 <= min_depth < max_depth:
            raise ValueError(f"DepthMetrics: need 0 <= min_depth < max_depth, got {min_depth} and {max_depth}")
        self.min_depth = min_depth
        self.max_depth = max_depth
        self.crop = crop
        self.add_state("sums", torch.zeros(len(DEPTH_METRIC_NAMES), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("images", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("skipped", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor | list[torch.Tensor], targets: torch.Tensor | list[torch.Tensor]) -> None:
        if isinstance(preds, torch.Tensor) != isinstance(targets, torch.Tensor) or len(preds) != len(targets):
            raise ValueError(
                "DepthMetrics.update: preds and targets must both be [B, H, W] tensors or both lists of [H, W], "
                f"with as many predictions as targets (got {len(preds)} and {len(targets)})"
            )
        if isinstance(preds, torch.Tensor) and (preds.dim() != 3 or targets.dim() != 3):
            raise ValueError(
                f"DepthMetrics.update: preds and targets must be [B, H, W], got {tuple(preds.shape)} and "
                f"{tuple(targets.shape)} (squeeze a channel dimension of 1 first)"
            )
        for i, (pred, target) in enumerate(zip(preds, targets, strict=True)):
            if pred.dim() != 2 or pred.shape != target.shape:
                raise ValueError(
                    f"DepthMetrics.update: image {i}: prediction {tuple(pred.shape)} and target "
                    f"{tuple(target.shape)} must be the same [H, W] (resize the prediction to the target's size)"
                )
            values = self._image(pred.detach().double(), target.detach().double())
            if values is None:
                self.skipped += 1
            else:
                self.sums += values
                self.images += 1

    def _image(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor | None:
        """The 9 figures of one [H, W] image in float64, or None without a valid pixel."""
        valid = (target > self.min_depth) & (target < self.max_depth)  # False at NaN
        if self.crop != "none":
            valid &= self._crop_mask(*target.shape, device=target.device)
        if not valid.any():
            return None
        t = target[valid]
        p = pred[valid].nan_to_num(nan=self.min_depth).clamp(self.min_depth, self.max_depth)
        ratio = torch.maximum(p / t, t / p)
        err = p - t
        log_err = p.log() - t.log()
        return torch.stack(
            [
                (ratio < 1.25).double().mean(),
                (ratio < 1.25**2).double().mean(),
                (ratio < 1.25**3).double().mean(),
                (err.abs() / t).mean(),
                (err * err / t).mean(),
                (err * err).mean().sqrt(),
                (log_err * log_err).mean().sqrt(),
                (p.log10() - t.log10()).abs().mean(),
                100 * ((log_err * log_err).mean() - log_err.mean() ** 2).clamp(min=0).sqrt(),
            ]
        )

    def _crop_mask(self, height: int, width: int, device: torch.device) -> torch.Tensor:
        if self.crop == "eigen":
            if (height, width) != (480, 640):
                raise ValueError(
                    f"DepthMetrics(crop='eigen'): Eigen's crop is defined on NYU Depth v2's 480 x 640 maps, got "
                    f"{height} x {width}; resize the prediction and evaluate on the full-size target, or use crop='none'"
                )
            rows, cols = EIGEN_CROP
        else:
            rows, cols = garg_crop(height, width)
        inside = torch.zeros(height, width, dtype=torch.bool, device=device)
        inside[rows, cols] = True
        return inside

    def compute(self) -> dict[str, torch.Tensor]:
        if self.skipped > 0:
            rank_zero_warn(
                f"DepthMetrics: {int(self.skipped)} image(s) without a valid target pixel were left out of the means "
                f"({int(self.images)} counted)"
            )
        means = self.sums / self.images  # NaN with no image: nothing to average
        return dict(zip(DEPTH_METRIC_NAMES, means.unbind(), strict=True))
