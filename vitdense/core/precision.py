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


def cpu_flags() -> set[str] | None:
    """The CPU's feature flags from /proc/cpuinfo (Linux x86), or None where unknown."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


@functools.cache
def cpu_bf16_support(size: int = 256, repeats: int = 7) -> Bf16Support:
    """Whether bf16 matmuls run natively on this CPU, measured.

    An x86 CPU whose flags lack AVX512-BF16 and AMX-BF16 has no native bf16. Otherwise a
    [size, size] matmul is timed in bf16 and in fp32 on one thread (best of `repeats`,
    interleaved, so that a busy machine slows both alike): native bf16 ran it about 2-4x
    faster than fp32 on the build machine, emulation (the bf16 ISA hidden with
    `ONEDNN_MAX_CPU_ISA=AVX2`) 20-70x slower; the threshold of 3x slower sits far from both.
    Cached: measured once per process (a few ms with native bf16, ~0.3 s without).
    """
    flags = cpu_flags()
    if flags is not None and "avx2" in flags and not flags & {"avx512_bf16", "amx_bf16"}:
        return Bf16Support(False, "this CPU has no native bf16 (no AVX512-BF16 or AMX-BF16 among its flags)")
    a = torch.randn(size, size, generator=torch.Generator().manual_seed(0))
    b = a.bfloat16()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times: dict[torch.dtype, list[float]] = {torch.float32: [], torch.bfloat16: []}
        for i in range(repeats + 2):  # the first two rounds warm up kernel selection and memory
            for x in (a, b):
                start = time.perf_counter()
                x @ x
                if i >= 2:
                    times[x.dtype].append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    ratio = min(times[torch.bfloat16]) / max(min(times[torch.float32]), 1e-9)
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
