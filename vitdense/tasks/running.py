"""How a task's model runs under the trainer: compiled when asked (`torch.compile`, where
this machine can), clipped by the norm over every shard under FSDP, and clipped with a fused
optimizer under bf16 autocast. `BaseTask` takes Lightning's two hooks for it from
`RunsOnTrainer`."""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

import torch
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.utilities import GradClipAlgorithmType, rank_zero_warn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDPModule


class RunsOnTrainer:
    """`configure_model` (compile backbone and head) and `configure_gradient_clipping`
    (FSDP's own clipping) for a task with `compile_options`, `backbone` and `head`."""

    #: torch.compile's arguments, or None: not compiled (set by the task)
    compile_options: dict[str, Any] | None = None

    def configure_model(self) -> None:
        """Lightning's hook before training or evaluation: compile backbone and head if asked."""
        if self.compile_options is None or getattr(self, "_compiled", False):
            return
        device = self.trainer.strategy.root_device if self._trainer is not None else self.device
        reason = compile_unsupported(self.compile_options, device)
        if reason is not None:
            rank_zero_warn(f"model.init_args.compile: {reason}; running eager")
            return
        self.backbone.compile(**self.compile_options)
        self.head.compile(**self.compile_options)
        self._compiled = True

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Lightning's clipping, except where Lightning refuses it:

        - by norm under FSDP: the root FSDP module's own `clip_grad_norm_` clips by the norm
          over every shard (torch's `clip_grad_norm_` would see only this process's shard);
        - a fused optimizer (`fused: true`) under bf16-mixed: Lightning refuses any mixed
          precision there because a fused step unscales fp16 gradients itself, but bf16 has
          no gradient scaler, so there is nothing to unscale and clipping is plain clipping
          (Lightning issue #21435; fp16 with a scaler is still refused by Lightning).
        """
        root = self._trainer.strategy.model if self._trainer is not None else None
        if gradient_clip_val and gradient_clip_algorithm in (None, "norm") and isinstance(root, FSDPModule):
            root.clip_grad_norm_(gradient_clip_val)
            return
        precision = self._trainer.precision_plugin if self._trainer is not None else None
        if gradient_clip_val and isinstance(precision, MixedPrecision) and precision.scaler is None:
            algorithm = GradClipAlgorithmType(gradient_clip_algorithm or "norm")
            Precision.clip_gradients(precision, optimizer, gradient_clip_val, algorithm)  # what Lightning does unmixed
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)


def compile_unsupported(options: dict[str, Any], device: torch.device) -> str | None:
    """Why `torch.compile(**options)` cannot run here, or None."""
    if not torch._dynamo.is_dynamo_supported():
        return f"torch {torch.__version__} cannot compile on Python {sys.version.split()[0]}"
    backend = options.get("backend", "inductor")
    compilers = [os.environ.get("CXX", ""), "c++", "g++", "clang++"]
    if backend == "inductor" and device.type == "cpu" and not any(c and shutil.which(c) for c in compilers):
        return "inductor needs a C++ compiler on the CPU and none was found (install g++, or set CXX)"
    return None
