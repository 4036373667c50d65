"""What every benchmark shares: autocast by name, the memory autograd saves, timing
that waits for the GPU, the CPU's name, training steps timed in alternating rounds, and
COCO-like box targets."""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    dtype = PRECISIONS[precision]
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def saved_activation_bytes(step: Callable[[], torch.Tensor]) -> int:
    """Bytes of the tensors autograd saves for backward during `step()` (each storage once)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = step()
    loss.backward()
    return sum(seen.values())


def time_call(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def spread(values: list[float], digits: int = 4, width: int = 0) -> str:
    """ "mean ± sample standard deviation" of `values` (the mean alone for one value, "-" for none),
    `digits` decimals, the mean padded to `width` characters."""
    if not values:
        return "-"
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:{width}.{digits}f}"
    return f"{mean:{width}.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def cpu_kind() -> str:
    """The CPU model and the capability torch uses (e.g. "AMD EPYC, AVX512")."""
    name = "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    return f"{name}, {torch.backends.cpu.get_cpu_capability()}"


def time_training_steps(
    losses: dict[str, Callable[[], torch.Tensor]], models: dict[str, nn.Module], args: argparse.Namespace
) -> dict[str, tuple[float, float]]:
    """{name: (median seconds of a training step — `losses[name]()` under autocast, then
    backward —, its memory in MB)}: `args.warmup` steps each, then `args.iters` rounds taking
    the models in turn, the order reversed every other round. Memory: the CUDA peak, or on
    CPU the activations autograd saves."""
    device = torch.device(args.device)

    def train(name: str) -> None:
        with autocast(device, args.precision):
            loss = losses[name]()
        loss.backward()
        models[name].zero_grad(set_to_none=True)

    memory: dict[str, float] = {}
    for name in losses:
        for _ in range(args.warmup):
            train(name)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            train(name)
            memory[name] = torch.cuda.max_memory_allocated() / 2**20
        else:
            with autocast(device, args.precision):
                memory[name] = saved_activation_bytes(losses[name]) / 2**20
            models[name].zero_grad(set_to_none=True)
    times: dict[str, list[float]] = {name: [] for name in losses}
    order = list(losses)
    for step in range(args.iters):
        for name in order if step % 2 == 0 else order[::-1]:
            times[name].append(time_call(lambda n=name: train(n), device))
    return {name: (statistics.median(ts), memory[name]) for name, ts in times.items()}


def alternating_rounds(
    steps: dict[str, Callable[[], object]], iters: int, warmup: int
) -> dict[str, tuple[float, float]]:
    """{name: (median wall ms, median process CPU ms)} of each step over `iters` rounds after
    `warmup`, taken in turn, the order reversed every other round. The CPU time (all
    threads of this process) is the work done, which other processes on the machine inflate
    far less than the wall time; with one thread it is the fairest figure on a shared machine."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
    order = list(steps)
    for i in range(warmup + iters):
        for name in order if i % 2 == 0 else order[::-1]:
            wall, cpu = time.perf_counter(), time.process_time()
            steps[name]()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if i >= warmup:
                times[name].append((wall * 1000, cpu * 1000))
    return {
        name: (statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)) for name, ts in times.items()
    }


def coco_like_targets(batch_size: int, num_classes: int, device: torch.device, num_keypoints: int = 0) -> list:
    """`BoxTargets` of 7 objects per image (COCO's mean), centres in [0.2, 0.8], sides in
    [0.05, 0.35], seeded; with `num_keypoints`, K keypoints each inside its box, visibility
    0, 1 or 2 drawn uniformly."""
    from vitdense.types import BoxTargets

    generator = torch.Generator().manual_seed(0)
    targets = []
    for _ in range(batch_size):
        centre = torch.rand(7, 2, generator=generator) * 0.6 + 0.2
        size = torch.rand(7, 2, generator=generator) * 0.3 + 0.05
        labels = torch.randint(num_classes, (7,), generator=generator)
        keypoints = None
        if num_keypoints:
            where = centre[:, None] + (torch.rand(7, num_keypoints, 2, generator=generator) - 0.5) * size[:, None]
            v = torch.randint(0, 3, (7, num_keypoints, 1), generator=generator).float()
            keypoints = torch.cat([where * (v > 0), v], -1).to(device)
        targets.append(BoxTargets(torch.cat([centre, size], 1).to(device), labels.to(device), keypoints))
    return targets


def machine(device: str) -> str:
    """What a figure was measured on: the CPU's name and capability, or the GPU's name."""
    return cpu_kind() if device == "cpu" else torch.cuda.get_device_name(device)


def memory_label(device: str) -> str:
    """The memory column's name: the CUDA peak, or on CPU the activations saved for backward."""
    return "peak MB" if device.startswith("cuda") else "saved act. MB"
