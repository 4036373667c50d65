"""DeiT's token distillation losses (Touvron et al., ICML 2021, section 4), as timm 1.0.31's
`timm.task.token_distillation.TokenDistillationTask` computes them.

The class-token head learns from the labels (the task's own loss), the distillation-token
head from a frozen teacher:

    soft: KL(softmax(teacher / tau) || softmax(student_dist / tau)) * tau^2, averaged over the
          batch (timm's `reduction='batchmean'`; DeiT's own code divides by B * K instead, so
          its soft loss is K times smaller at equal tau)
    hard: cross-entropy of the distillation logits against the teacher's argmax

    total = task_weight * task_loss + distill_weight * distill_loss

with DeiT's alpha: distill_weight = alpha, task_weight = 1 - alpha (timm's complementary
mode, `task_loss_weight=1 - alpha`; DeiT trains hard distillation at alpha = 0.5).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F

DistillationType = Literal["hard", "soft"]


class TokenDistillationLosses(NamedTuple):
    """The combined loss and its two parts (scalars)."""

    loss: torch.Tensor
    task_loss: torch.Tensor
    distill_loss: torch.Tensor


def token_distillation_loss(
    dist_logits: torch.Tensor, teacher_logits: torch.Tensor, distillation: DistillationType, tau: float = 1.0
) -> torch.Tensor:
    """The distillation head's loss: dist_logits, teacher_logits [B, K] -> scalar (see module doc)."""
    if distillation == "soft":
        log_s = F.log_softmax(dist_logits / tau, dim=-1)
        log_t = F.log_softmax(teacher_logits / tau, dim=-1)
        return F.kl_div(log_s, log_t, reduction="batchmean", log_target=True) * (tau**2)
    if distillation == "hard":
        return F.cross_entropy(dist_logits, teacher_logits.argmax(dim=-1))
    raise ValueError(f"distillation={distillation!r}: expected 'hard' or 'soft'")


def combine_token_distillation(
    task_loss: torch.Tensor,
    dist_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    distillation: DistillationType,
    alpha: float = 0.5,
    tau: float = 1.0,
) -> TokenDistillationLosses:
    """(1 - alpha) * task_loss + alpha * distillation loss, with both parts."""
    distill = token_distillation_loss(dist_logits, teacher_logits.detach(), distillation, tau)
    return TokenDistillationLosses((1.0 - alpha) * task_loss + alpha * distill, task_loss, distill)
