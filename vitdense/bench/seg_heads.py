"""`seg-heads`: semantic segmentation's two designs on one ViT — Segmenter's mask transformer
decoder after the encoder (`SegmentationTask`, its default head) and EoMT's queries inside the
encoder's last blocks (`UniversalSegmentationTask(segmentation="semantic")`, EoMT's semantic
settings: 100 queries, Mask2Former's loss on 12,544 points per mask) — the same backbone
weights, the training step and the inference step each timed in alternating rounds.

The training step is what `fit` runs: `forward_batch(batch, "train")` and `compute_loss` under
autocast, backward, the task's own optimizer (`configure_optimizers`) stepped. EoMT trains with
its masked attention in every joined block (the start of its annealing; its cost does not
change along it, since training always predicts before each joined block). Inference is the
plain model on one 512 x 512 window: Segmenter's logits `model(images)` against EoMT's class
scores `model.semantic(images)` once annealing has finished (no masked attention, the last
block's prediction only: the model EoMT deploys); EoMT with its masks still on (the task's
default when no annealing is configured) is a third row.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, NamedTuple

import torch

from vitdense.bench.common import autocast, machine, memory_label, saved_activation_bytes, time_call

if TYPE_CHECKING:
    from vitdense.tasks.base import BaseTask

#: the rows: Segmenter's task, EoMT's as deployed (annealed), EoMT with its masked attention
SEGMENTER, EOMT, EOMT_MASKED = "Segmenter", "EoMT", "EoMT, masks on"


class Timing(NamedTuple):
    """One model's step: median milliseconds, images per second, memory in MB (NaN: not measured)."""

    ms: float
    img_s: float
    mem_mb: float


class SegHeadsResult(NamedTuple):
    """Both steps of each model, by name, and the backbone's depth and EoMT's joined blocks."""

    train: dict[str, Timing]
    inference: dict[str, Timing]
    depth: int
    num_blocks: int
    optimizer: str
    #: the 1-minute load average when the timing started and when it ended (other processes on the cores)
    load: tuple[float, float]


#: label maps: classes per image (ADE20K has about 9 on average) and cells per side of the blocky map
CLASSES_PER_IMAGE, CELLS = 8, 8


def blocky_label_maps(batch_size: int, size: int, num_classes: int, generator: torch.Generator) -> torch.Tensor:
    """[B, size, size] int64 label maps of `CELLS` x `CELLS` rectangular regions, each image's
    regions drawn from its own `CLASSES_PER_IMAGE` classes: several segments per image, as the
    mask loss sees in real data (one target per class present)."""
    cell = -(-size // CELLS)
    maps = []
    for _ in range(batch_size):
        classes = torch.randperm(num_classes, generator=generator)[: min(CLASSES_PER_IMAGE, num_classes)]
        coarse = classes[torch.randint(len(classes), (CELLS, CELLS), generator=generator)]
        maps.append(coarse.repeat_interleave(cell, 0).repeat_interleave(cell, 1)[:size, :size])
    return torch.stack(maps)


def eomt_num_blocks(depth: int) -> int:
    """Blocks EoMT's queries join: 3 for 12-block ViTs (S, B), 4 for 24-block ViT-L; at most `depth`."""
    return min(depth, 4 if depth >= 24 else 3)


def native_bf16() -> bool:
    """Whether the CPU computes bf16 itself (AVX512-BF16 or AMX); elsewhere oneDNN emulates it."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return bool(flags & {"avx512_bf16", "amx_bf16"})
    return False


def build_tasks(args: argparse.Namespace) -> dict[str, BaseTask]:
    """{"Segmenter": SegmentationTask, "EoMT": UniversalSegmentationTask}, their backbones
    `args.model` (random weights, the same in both) at `args.img_size`."""
    from vitdense.heads import EoMTHead
    from vitdense.tasks import BackboneConfig, SegmentationTask, UniversalSegmentationTask

    torch.manual_seed(0)
    model_args = {"depth": args.depth} if args.depth is not None else None
    backbone = BackboneConfig(name=args.model, img_size=args.img_size, model_args=model_args)
    segmenter = SegmentationTask(num_classes=args.num_classes, backbone=backbone)
    blocks = eomt_num_blocks(segmenter.backbone.depth)
    head = partial(EoMTHead, num_queries=args.num_queries, num_blocks=blocks)
    eomt = UniversalSegmentationTask(
        num_classes=args.num_classes, segmentation="semantic", head=head, backbone=backbone
    )
    eomt.backbone.load_state_dict(segmenter.backbone.state_dict())
    return {SEGMENTER: segmenter, EOMT: eomt}


def bench_seg_heads(args: argparse.Namespace) -> SegHeadsResult:
    """Each model's training and inference step (`time_rounds`) on one batch of random images
    and blocky label maps (`blocky_label_maps`); memory of the training step (the CUDA peak, or on CPU the
    activations autograd saves), of inference on CUDA only (nothing is saved under no_grad)."""
    from vitdense.types import ImageSizes, SegmentedImages

    load = os.getloadavg()[0]
    device = torch.device(args.device)
    tasks = {name: task.to(device) for name, task in build_tasks(args).items()}
    b, size = args.batch_size, args.img_size
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(b, 3, size, size, generator=generator).to(device)
    masks = blocky_label_maps(b, size, args.num_classes, generator).to(device)
    sizes = ImageSizes.full(b, (size, size))
    batch = SegmentedImages(images, masks, torch.arange(b), image_sizes=sizes, mask_sizes=sizes)
    optimizers = {name: task.configure_optimizers()["optimizer"] for name, task in tasks.items()}

    def loss_of(name: str) -> torch.Tensor:
        task = tasks[name]
        return task.compute_loss(task.forward_batch(batch, "train"), batch, "train").total

    def train(name: str) -> None:
        with autocast(device, args.precision):
            loss = loss_of(name)
        loss.backward()
        optimizers[name].step()
        optimizers[name].zero_grad(set_to_none=True)

    def train_memory(name: str) -> float:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            train(name)
            return torch.cuda.max_memory_allocated() / 2**20
        with autocast(device, args.precision):
            memory = saved_activation_bytes(lambda: loss_of(name)) / 2**20
        optimizers[name].zero_grad(set_to_none=True)
        return memory

    for task in tasks.values():
        task.train()
    trained = time_rounds({name: partial(train, name) for name in tasks}, args, device, train_memory)

    segmenter, eomt = tasks[SEGMENTER].model.eval(), tasks[EOMT].model.eval()
    probs = eomt.head.attn_mask_probs

    def eomt_inference(prob: float) -> torch.Tensor:
        probs.fill_(prob)  # 0: annealed (no masks, one prediction); 1: masks in every joined block
        return eomt.semantic(images)

    steps = {SEGMENTER: lambda: segmenter(images), EOMT: partial(eomt_inference, 0.0)}
    steps[EOMT_MASKED] = partial(eomt_inference, 1.0)

    def infer(name: str) -> None:
        with torch.no_grad(), autocast(device, args.precision):
            steps[name]()

    def infer_memory(name: str) -> float:
        if device.type != "cuda":
            return float("nan")
        torch.cuda.reset_peak_memory_stats()
        infer(name)
        return torch.cuda.max_memory_allocated() / 2**20

    inferred = time_rounds({name: partial(infer, name) for name in steps}, args, device, infer_memory)
    optimizer = type(optimizers[EOMT]).__name__
    loads = (load, os.getloadavg()[0])
    return SegHeadsResult(trained, inferred, eomt.backbone.depth, eomt.head.num_blocks, optimizer, loads)


def time_rounds(
    steps: dict[str, Callable[[], None]],
    args: argparse.Namespace,
    device: torch.device,
    memory: Callable[[str], float],
) -> dict[str, Timing]:
    """{name: its `Timing`}: `args.warmup` steps and `memory(name)` of each, then
    the median of `args.steps` rounds taking them in turn, the order reversed every other round
    (so that drift of the machine hits all alike)."""
    mem: dict[str, float] = {}
    for name, step in steps.items():
        for _ in range(args.warmup):
            step()
        mem[name] = memory(name)
    times: dict[str, list[float]] = {name: [] for name in steps}
    order = list(steps)
    for i in range(args.steps):
        for name in order if i % 2 == 0 else order[::-1]:
            times[name].append(time_call(steps[name], device))
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    return {name: Timing(1000 * s, args.batch_size / s, mem[name]) for name, s in medians.items()}


def bf16_warning(args: argparse.Namespace) -> str | None:
    """What to know about bf16 on this CPU, or None."""
    if args.precision == "bf16" and args.device == "cpu" and not native_bf16():
        return (
            "warning: --precision bf16 on a CPU without AVX512-BF16 or AMX: bf16 is emulated (converted to fp32 "
            "around each matmul) and usually slower than fp32; these figures do not say how bf16 runs on hardware "
            "that has it"
        )
    return None


def run_seg_heads(args: argparse.Namespace) -> None:
    if (warning := bf16_warning(args)) is not None:
        print(warning, file=sys.stderr)
    print_seg_heads(args, bench_seg_heads(args))


def print_seg_heads(args: argparse.Namespace, result: SegHeadsResult) -> None:
    size = f"{args.img_size} x {args.img_size}"
    precision = args.precision
    if precision == "bf16" and args.device == "cpu":
        precision += " (CPU autocast, native bf16)" if native_bf16() else " (CPU autocast, bf16 emulated)"
    print(
        f"semantic segmentation heads on {args.model} (random weights, {result.depth} blocks) at {size}, "
        f"batch {args.batch_size}, {args.num_classes} classes, {precision}: Segmenter's mask transformer "
        f"(2 layers) vs EoMT ({args.num_queries} queries in the last {result.num_blocks} blocks), on "
        f"{machine(args.device)} ({torch.get_num_threads()} threads, torch {torch.__version__}), "
        f"median of {args.steps} alternating rounds, load average {result.load[0]:.2f} -> {result.load[1]:.2f}"
    )
    mem = memory_label(args.device)
    tables = (
        (f"training step (forward, loss, backward, {result.optimizer} step)", result.train),
        (f"inference ({size}, one window, eval, no_grad)", result.inference),
    )
    for title, rows in tables:
        print(f"{title:52}{'ms/step':>10}{'img/s':>10}{mem:>16}")
        for name, row in rows.items():
            print(f"{'  ' + name:52}{row.ms:10.1f}{row.img_s:10.2f}{_or_dash(row.mem_mb, 0):>16}")
        ours, peer = rows[EOMT], rows[SEGMENTER]
        ratio = f"  {EOMT} / {SEGMENTER}"
        mem_ratio = _or_dash(ours.mem_mb / peer.mem_mb, 3)
        print(f"{ratio:52}{ours.ms / peer.ms:10.3f}{ours.img_s / peer.img_s:10.3f}{mem_ratio:>16}")
    print(
        f"{EOMT}: inference once masked attention is annealed away (the deployed model); "
        f"'{EOMT_MASKED}': masks in every joined block (no annealing configured, or mid-annealing)"
    )


def _or_dash(value: float, decimals: int) -> str:
    return "-" if math.isnan(value) else f"{value:.{decimals}f}"
