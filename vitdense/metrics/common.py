"""Metrics every family shares: the mean evaluation loss (`LossMeans`, `WeightedMean`), and
the gathering of per-image list states across processes (`WholeListGather`)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torchmetrics import Metric

from vitdense.types import Losses


class WeightedMean(Metric):
    """sum(value * weight) / sum(weight) over every update, each update adding a sum of
    weighted values and the sum of their weights (a mean `v` over `w` items: `v * w, w`; a
    `LossSum` as it is), the sums added over processes at `compute` (one collective per
    state, none per update). A NaN value makes the mean NaN; no weight at all (a split
    without a labelled pixel or a target box) gives the sum itself, 0 for such losses, as
    DETR's box count clamped at 1 does.

    torchmetrics' `MeanMetric` either drops NaN values (a diverged loss would look finite)
    or, with `nan_strategy="disable"`, drops the weights (torchmetrics 1.9,
    Lightning-AI/torchmetrics#3434).

    Args:
        dtype: of the sums; float64 by default, so that a split's pixel count (5e8 for
            ADE20K's validation) stays exact (float32 holds integers up to 1.7e7 only).
    """

    full_state_update = False

    def __init__(self, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        self.add_state("total", torch.zeros((), dtype=dtype), dist_reduce_fx="sum")
        self.add_state("weight", torch.zeros((), dtype=dtype), dist_reduce_fx="sum")

    def update(self, total: torch.Tensor | float, weight: torch.Tensor | float) -> None:
        """Add scalars: `total`, a sum of values times their weights, and `weight`, the sum of the weights."""
        self.total += torch.as_tensor(total).detach().to(self.total)
        self.weight += torch.as_tensor(weight).detach().to(self.weight)

    def compute(self) -> torch.Tensor:
        return torch.where(self.weight == 0, self.total, self.total / self.weight)


class LossMeans:
    """Evaluation losses as the dataset's: every term (and the total), summed over every
    batch of every process and divided once.

    A loss given with a `LossSum` (`Losses.sums`: segmentation's summed pixel cross-entropy
    and its labelled pixels; each DETR term's sum and its target boxes or query weights)
    is the split's summed numerators over its summed denominators: the same on any number
    of processes and for any batch size, and, on one batch, the batch's own value. Any
    other loss is taken as a mean over its batch's images and weighted by them (`weight`),
    which gives the dataset's mean for per-image means (cross-entropy). A total left out of
    `sums` whose terms are all in it is their sum (`{stage}/loss` = sum of the term figures).

    Lightning's `self.log(..., on_epoch=True, sync_dist=True)` is not the dataset's mean
    when processes hold different numbers of images (21 images on 2 processes: 11 and 10):
    it averages the processes' integer image counts in place, which floors them (10.5 -> 10),
    so the loss comes out N / (W * floor(N / W)) too high, 21/20 here (Lightning 2.6,
    Lightning-AI/pytorch-lightning#21859). Here each `{stage}/{name}` is a `WeightedMean`:
    `update` adds to sums on this process (no collective per step, so processes may run
    different numbers of steps); `pop` adds the sums over processes once, at epoch end, and
    starts the stage afresh. Every process must call `pop` for a stage it has updated, with
    the same names (a task's terms are the same on every batch).
    """

    def __init__(self) -> None:
        self._means: dict[str, WeightedMean] = {}
        self._totals_of_terms: set[str] = set()  # stages whose total is the sum of its terms' figures

    def update(self, stage: str, losses: Losses, weight: int) -> None:
        """Add a batch's `losses` (`{stage}/loss` and `{stage}/{term}`): each `LossSum` of
        `losses.sums` whole, every other loss weighted by `weight` (the batch's images)."""
        values = {"loss": losses.total, **losses.terms}
        if losses.sums and "loss" not in losses.sums:
            if missing := sorted(set(losses.terms) - set(losses.sums)):
                raise ValueError(f"Losses.sums has no LossSum for {missing}: the total cannot be the sum of its terms")
            self._totals_of_terms.add(stage)
            del values["loss"]
        for name, value in values.items():
            key = f"{stage}/{name}"
            if key not in self._means:  # on the loss's device: the reduction runs where the states live
                dtype = torch.float32 if value.device.type == "mps" else torch.float64  # MPS has no float64
                self._means[key] = WeightedMean(dtype).to(value.device)
            mean = self._means[key]
            # a mean over the batch's images as its sum, in the sums' precision
            numerator, denominator = losses.sums.get(name, (value.detach().to(mean.total.dtype) * weight, weight))
            mean.update(numerator, denominator)

    def pop(self, stage: str) -> dict[str, torch.Tensor]:
        """The stage's figures over the epoch and every process (`{stage}/loss` first, float32),
        then forgotten. Empty when the stage logged no loss."""
        out = {}
        for key in [k for k in self._means if k.startswith(f"{stage}/")]:
            out[key] = self._means.pop(key).compute()  # torchmetrics adds the sums over processes
        if stage in self._totals_of_terms:
            self._totals_of_terms.remove(stage)
            out = {f"{stage}/loss": torch.stack(list(out.values())).sum(), **out}
        return {key: value.float() for key, value in out.items()}


class WholeListGather:
    """Mixin for a torchmetrics `Metric` whose states are all lists (one entry per image): each
    list is gathered whole from every process, in rank order, so processes may hold different
    numbers of images.

    vitdense evaluates every image once, so processes may hold different counts (7 images on
    2 processes: 4 and 3). torchmetrics gathers a list state element by element, a collective
    per image that then does not match across processes; here each list state is gathered
    whole (`all_gather_object`, on the CPU). Every state is gathered in the same rank order,
    so the i-th entries of the metric's lists still belong to one image. Put it first among
    the bases (`class MyAP(WholeListGather, Metric)`) so that its `_sync_dist` is the one used.
    """

    def _sync_dist(self, dist_sync_fn: Any = None, process_group: Any = None) -> None:
        group = process_group or self.process_group
        world = dist.get_world_size(group)
        for attr in self._reductions:
            # (entries that are not tensors, e.g. masks' RLE tuples, stay as they are)
            local = [t.cpu() if isinstance(t, torch.Tensor) else t for t in getattr(self, attr)]
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, local, group=group)
            merged = [t for part in gathered for t in part]
            setattr(self, attr, [t.to(self.device) if isinstance(t, torch.Tensor) else t for t in merged])
