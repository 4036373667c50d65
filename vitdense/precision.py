"""`precision: auto` — bf16 autocast where the hardware computes bf16, fp32 elsewhere.

bf16 autocast pays only where the device has bf16 arithmetic (CUDA GPUs with bf16
support; x86 CPUs with AVX512-BF16 or AMX). Elsewhere the library emulates it: on an
AVX2-only CPU a bf16 matmul was measured over 100x slower than fp32, which turns a
7-minute demo into hours. Whether a CPU has it is *measured* (one small bf16 and fp32
matmul each), so that what the libraries really do decides — including when the bf16
hardware is hidden from them (`ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`).
"""

from __future__ import annotations

import functools
import time
from typing import NamedTuple

import torch

#: precision values that run matrix products in bf16
BF16_PRECISIONS = ("bf16-mixed", "bf16-true", "bf16")


class Bf16Support(NamedTuple):
    """Whether a device computes bf16 natively, and the evidence, in words."""

    native: bool
    reason: str


@functools.cache
def cpu_bf16_support(size: int = 256, repeats: int = 5) -> Bf16Support:
    """Time a [size, size] matmul in bf16 and in fp32 on this CPU (best of `repeats`).

    Native bf16 (AVX512-BF16, AMX) ran it about 2x faster than fp32 on the build machine;
    emulation (AVX2 only, or the bf16 ISA hidden) ran it about 60x slower. The threshold of
    3x slower sits far from both, so a busy machine does not flip the answer. Cached:
    measured once per process (a few ms with native bf16, ~0.1 s without).
    """
    a = torch.randn(size, size, generator=torch.Generator().manual_seed(0))

    def best_seconds(x: torch.Tensor) -> float:
        for _ in range(2):  # warm-up: kernel selection, first-touch allocation
            x @ x
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            x @ x
            times.append(time.perf_counter() - start)
        return min(times)

    fp32, bf16 = best_seconds(a), best_seconds(a.bfloat16())
    ratio = bf16 / max(fp32, 1e-9)
    if ratio < 3.0:
        speed = f"{1 / ratio:.1f}x faster than" if ratio < 1 else f"{ratio:.1f}x the time of"
        return Bf16Support(True, f"this CPU computes bf16 natively: a bf16 matmul ran {speed} fp32")
    return Bf16Support(False, f"this CPU has no native bf16: a bf16 matmul ran {ratio:.0f}x slower than fp32")


def bf16_support(device: str) -> Bf16Support:
    """bf16 support of an accelerator kind: "cpu", "cuda"/"gpu", "mps", or "auto" (CUDA if present, else CPU)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device in ("cuda", "gpu"):
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False):
            return Bf16Support(True, f"{torch.cuda.get_device_name()} computes bf16 natively")
        return Bf16Support(False, "this GPU has no native bf16")
    if device == "cpu":
        return cpu_bf16_support()
    return Bf16Support(False, f"bf16 autocast is not checked on {device!r}")


class ResolvedPrecision(NamedTuple):
    """What to hand Lightning, and what to tell the user (`note` is info, `warning` a warning)."""

    precision: str | int | None
    note: str | None = None
    warning: str | None = None


def resolve_precision(precision: str | int | None, accelerator: str = "auto") -> ResolvedPrecision:
    """Resolve "auto" for an accelerator ("cpu", "gpu"/"cuda", "mps", "auto").

    "auto" becomes "bf16-mixed" where the accelerator computes bf16 natively and "32-true"
    otherwise, with the reason as a note. An explicit bf16 precision on a CPU without
    native bf16 is kept, with a warning of how much slower it runs. Anything else is
    returned unchanged.
    """
    accelerator = str(accelerator).lower()
    if precision == "auto":
        support = bf16_support(accelerator)
        chosen = "bf16-mixed" if support.native else "32-true"
        return ResolvedPrecision(chosen, note=f"precision: {chosen} ({support.reason})")
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    if on_cpu and str(precision) in BF16_PRECISIONS and not (support := cpu_bf16_support()).native:
        return ResolvedPrecision(
            precision, warning=f"precision={precision}: {support.reason}; `precision: auto` would pick 32-true"
        )
    return ResolvedPrecision(precision)
