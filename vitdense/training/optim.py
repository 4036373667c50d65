"""Parameter groups and learning-rate schedules of the ViT fine-tuning recipes."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from vitdense.backbone import VisionTransformer
from vitdense.core.errors import ConfigError


class WarmupSchedule(LambdaLR):
    """Linear warmup from 0 to the base rate, then a decay over the rest of the run.

    Lengths count the unit the task steps the schedule in (`BaseTask.lr_interval`: optimizer
    steps by default, or epochs). Left unset, `total_steps` is the trainer's whole run, and
    a warmup given in epochs is converted with the trainer's steps per epoch — so recipes
    written in epochs (MAE's 10 warmup epochs) survive a change of devices, batch size or
    gradient accumulation. `BaseTask.on_train_start` resolves them (`resolve_schedules`) before
    the first step; built by hand, pass `total_steps` and `warmup_steps`.

    Args:
        warmup_steps: warmup length in schedule units (steps or epochs).
        total_steps: the whole schedule's length in schedule units; None: the trainer's.
        min_lr_ratio: final learning rate as a fraction of the base rate.
        warmup_epochs: warmup length in epochs (may be fractional); adds to `warmup_steps`.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        warmup_steps: int = 0,
        total_steps: int | None = None,
        min_lr_ratio: float = 0.0,
        warmup_epochs: float = 0.0,
    ) -> None:
        if warmup_steps < 0 or warmup_epochs < 0:
            raise ConfigError(f"warmup_steps={warmup_steps}, warmup_epochs={warmup_epochs}: must not be negative")
        self.warmup_steps = warmup_steps
        self.warmup_epochs = warmup_epochs
        self.total_steps = total_steps
        self.min_lr_ratio = min_lr_ratio
        # epochs in schedule units; unknown (warmup_epochs ignored) until `resolve`
        self._units_per_epoch: float | None = None
        # one factor per parameter group (the same for all but in `TwoStageWarmupPolyLR`)
        super().__init__(
            optimizer, [partial(self._group_factor, bool(g.get("backbone"))) for g in optimizer.param_groups]
        )

    @property
    def warmup(self) -> int:
        """Warmup length in schedule units, epochs converted."""
        epochs = round(self.warmup_epochs * self._units_per_epoch) if self._units_per_epoch else 0
        return self.warmup_steps + epochs

    def resolve(self, total: int, units_per_epoch: float) -> None:
        """Fill in the trainer's run length (if unset) and the length of an epoch, both in
        schedule units, and set the learning rate of the first step accordingly."""
        if self.total_steps is None:
            self.total_steps = total
        self._units_per_epoch = units_per_epoch
        if self.warmup_epochs and not units_per_epoch:
            raise ConfigError("warmup_epochs needs the trainer's steps per epoch; give warmup_steps instead")
        if self.warmup >= self.total_steps > 0:  # fine for a smoke test, a mistake for a recipe: say it
            rank_zero_warn(f"the warmup ({self.warmup}) is as long as the whole schedule ({self.total_steps})")
        # the constructor already set the rate of step 0 without knowing these
        self._last_lr = [base * f(self.last_epoch) for base, f in zip(self.base_lrs, self.lr_lambdas, strict=True)]
        for group, lr in zip(self.optimizer.param_groups, self._last_lr, strict=True):
            group["lr"] = lr

    def decay(self, progress: float) -> float:
        """Factor at `progress` in [0, 1] of the decay phase (1 at its start)."""
        raise NotImplementedError

    def _group_factor(self, backbone: bool, step: int) -> float:
        """Factor of a group of backbone (or other) parameters at `step`."""
        return self._factor(step)

    def _factor(self, step: int) -> float:
        warmup = self.warmup
        if step < warmup:
            return (step + 1) / warmup
        if self.total_steps is None:
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, self.total_steps - warmup))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * self.decay(progress)


class WarmupCosineLR(WarmupSchedule):
    """Warmup, then cosine decay to `min_lr_ratio` x the base rate (the ViT paper's
    fine-tuning schedule, appendix B.1.1; MAE's)."""

    def decay(self, progress: float) -> float:
        return 0.5 * (1 + math.cos(math.pi * progress))


class WarmupPolyLR(WarmupSchedule):
    """Warmup, then polynomial decay `(1 - progress) ** power` (Segmenter's and mmseg's
    "poly" schedule with power 0.9).

    Args:
        power: exponent of the decay.
        (the rest: see `WarmupSchedule`)
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        power: float = 0.9,
        warmup_steps: int = 0,
        total_steps: int | None = None,
        min_lr_ratio: float = 0.0,
        warmup_epochs: float = 0.0,
    ) -> None:
        self.power = power
        super().__init__(optimizer, warmup_steps, total_steps, min_lr_ratio, warmup_epochs)

    def decay(self, progress: float) -> float:
        return (1 - progress) ** self.power


class TwoStageWarmupPolyLR(WarmupPolyLR):
    """EoMT's two-stage warmup: for the first `warmup_steps` the backbone's rate is 0 (it is
    frozen while the new head warms up linearly from 0), then the backbone warms up
    linearly over `backbone_warmup_steps`; each then decays as `(1 - progress) ** power`
    to the end of the run (EoMT: 500 and 1000 steps, power 0.9). The backbone's groups are
    those `param_groups` marks (`"backbone": True`).

    Args:
        warmup_steps: steps of the head's warmup, with the backbone frozen.
        backbone_warmup_steps: steps of the backbone's warmup after those.
        power: exponent of the decay.
        total_steps: the whole schedule (None: the trainer's).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        warmup_steps: int = 500,
        backbone_warmup_steps: int = 1000,
        power: float = 0.9,
        total_steps: int | None = None,
    ) -> None:
        if backbone_warmup_steps < 0:
            raise ConfigError(f"backbone_warmup_steps={backbone_warmup_steps}: must not be negative")
        self.backbone_warmup_steps = backbone_warmup_steps
        super().__init__(optimizer, power, warmup_steps, total_steps)

    def _group_factor(self, backbone: bool, step: int) -> float:
        # EoMT's factors: step / warmup (0 at step 0), then the decay counted from the warmup's end
        start, warmup = (self.warmup, self.backbone_warmup_steps) if backbone else (0, self.warmup)
        if step < start:
            return 0.0
        if step < start + warmup:
            return (step - start) / warmup
        if self.total_steps is None:
            return 1.0
        progress = max(0, step - start - warmup) / max(1, self.total_steps - start - warmup)
        return max(0.0, 1 - progress) ** self.power


class WarmupMultiStepLR(WarmupSchedule):
    """Warmup, then the base rate multiplied by `gamma` at each milestone (DETR: x0.1 at
    epoch 200 of 300). Milestones may be given in epochs (converted with the trainer's steps
    per epoch, like `warmup_epochs`) or in schedule units, counted from the first step.

    Args:
        milestone_epochs: epochs (may be fractional) at which the rate drops.
        milestones: schedule units (steps, or epochs with `lr_interval: epoch`) at which it drops.
        gamma: factor of each drop.
        (the rest: see `WarmupSchedule`; `min_lr_ratio` does not apply)
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        milestone_epochs: list[float] | None = None,
        milestones: list[int] | None = None,
        gamma: float = 0.1,
        warmup_steps: int = 0,
        total_steps: int | None = None,
        warmup_epochs: float = 0.0,
    ) -> None:
        self.milestone_epochs = list(milestone_epochs or [])
        self.milestones = list(milestones or [])
        self.gamma = gamma
        super().__init__(optimizer, warmup_steps, total_steps, 0.0, warmup_epochs)

    @property
    def milestone_steps(self) -> list[int]:
        """Every milestone in schedule units (epoch milestones only once resolved)."""
        epochs = [round(e * self._units_per_epoch) for e in self.milestone_epochs] if self._units_per_epoch else []
        return sorted(self.milestones + epochs)

    def _factor(self, step: int) -> float:
        warmup = self.warmup
        if step < warmup:
            return (step + 1) / warmup
        return self.gamma ** sum(step >= m for m in self.milestone_steps)


def param_groups(
    backbone: VisionTransformer,
    head: nn.Module,
    backbone_lr_scale: float = 1.0,
    layer_decay: float = 1.0,
) -> list[dict]:
    """Parameter groups with an `lr_scale` each and no weight decay where it does not belong.

    Backbone parameters get `backbone_lr_scale * layer_decay ** (num_layers - 1 - layer_id)`
    (layer-wise decay as in BEiT/MAE fine-tuning: 1 at the top, smaller towards the input);
    head parameters scale 1. Position embeddings, prefix tokens, norms and biases get
    `weight_decay = 0`; the others keep the optimizer's weight decay. Frozen parameters are left out.
    Each group says whether it holds backbone parameters (`"backbone"`, for schedules that
    treat them apart: `TwoStageWarmupPolyLR`).
    """
    groups: dict[tuple[float, bool, bool], dict] = {}
    no_decay = backbone.no_weight_decay()
    named = [(f"backbone.{n}", p, n) for n, p in backbone.named_parameters()]
    named += [(f"head.{n}", p, None) for n, p in head.named_parameters()]
    for full_name, param, bb_name in named:
        if not param.requires_grad:
            continue
        if bb_name is not None:
            scale = backbone_lr_scale * layer_decay ** (backbone.num_layers - 1 - backbone.layer_id(bb_name))
            decay = bb_name not in no_decay
        else:
            scale, decay = 1.0, param.ndim > 1
        backbone_param = bb_name is not None
        group = groups.setdefault(
            (scale, decay, backbone_param), {"params": [], "names": [], "lr_scale": scale, "backbone": backbone_param}
        )
        if not decay:
            group["weight_decay"] = 0.0
        group["params"].append(param)
        group["names"].append(full_name)
    return list(groups.values())


def optimizer_config(
    optimizer: Callable[[list[dict]], torch.optim.Optimizer],
    lr_scheduler: Callable[[torch.optim.Optimizer], Any],
    groups: list[dict],
    interval: str,
    monitor: str,
) -> dict:
    """What `configure_optimizers` returns: the optimizer over `groups`, each group's rate
    times its `lr_scale`, and the schedule stepped every `interval` ("step" or "epoch"; a
    plateau schedule watches `monitor` once it exists and counts its patience in epochs)."""
    opt = optimizer(groups)
    for group in opt.param_groups:
        group["lr"] *= group.get("lr_scale", 1.0)
    scheduler = lr_scheduler(opt)
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        interval = "epoch"
    return {"optimizer": opt, "lr_scheduler": {"scheduler": scheduler, "interval": interval, "monitor": monitor}}


def resolve_schedules(trainer: Any) -> None:
    """Give every `WarmupSchedule` of a starting fit its length (the whole training, in the
    unit it steps in) and the units per epoch its warmup in epochs is counted in."""
    for config in trainer.lr_scheduler_configs:
        if isinstance(config.scheduler, WarmupSchedule):
            config.scheduler.resolve(*schedule_units(trainer, config.interval))


def schedule_units(trainer: Any, interval: str) -> tuple[int, float]:
    """(schedule length, schedule units per epoch) in the unit the schedule steps in."""
    if interval == "epoch":
        if trainer.max_epochs is None or trainer.max_epochs < 0:
            raise ConfigError("lr_interval: epoch needs trainer.max_epochs (the schedule's length in epochs)")
        return trainer.max_epochs, 1.0
    total = int(trainer.estimated_stepping_batches)
    per_epoch = math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches)
    return total, float(per_epoch)


#: the defaults of every task: AdamW, no warmup, cosine decay over the whole run
DEFAULT_OPTIMIZER = partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.05)
DEFAULT_LR_SCHEDULER = partial(WarmupCosineLR, warmup_steps=0)
