"""Parameter groups and learning-rate schedules of the ViT fine-tuning recipes."""

from __future__ import annotations

import math
from functools import partial

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from vitdense.backbone import VisionTransformer


class WarmupCosineLR(LambdaLR):
    """Linear warmup from 0, then cosine decay to `min_lr_ratio` x the base rate; stepped per
    iteration (the paper's fine-tuning schedule, appendix B.1.1).

    Args:
        warmup_steps: iterations of linear warmup.
        total_steps: iterations of the whole run; None lets `BaseTask` fill in the trainer's
            `estimated_stepping_batches` before the first step.
        min_lr_ratio: final learning rate as a fraction of the base rate.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        warmup_steps: int = 0,
        total_steps: int | None = None,
        min_lr_ratio: float = 0.0,
    ) -> None:
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.min_lr_ratio = min_lr_ratio
        super().__init__(optimizer, self._factor)

    def _factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.total_steps is None:
            return 1.0
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


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
    """
    groups: dict[tuple[float, bool], dict] = {}
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
        group = groups.setdefault((scale, decay), {"params": [], "names": [], "lr_scale": scale})
        if not decay:
            group["weight_decay"] = 0.0
        group["params"].append(param)
        group["names"].append(full_name)
    return list(groups.values())


#: the defaults of every task: AdamW, no warmup, cosine decay over the whole run
DEFAULT_OPTIMIZER = partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.05)
DEFAULT_LR_SCHEDULER = partial(WarmupCosineLR, warmup_steps=0)
