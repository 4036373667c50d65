"""`det-heads`: the training step and the inference of each detection head on one backbone,
and with `--keypoints K` each head again with a keypoint head (K keypoints per query)."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from vitdense.bench.common import (
    autocast,
    coco_like_targets,
    machine,
    memory_label,
    time_call,
    time_training_steps,
)


def detection_heads(
    num_queries: int = 300, num_groups: int = 13, num_keypoints: int = 0
) -> dict[str, tuple[Callable[[int, int], nn.Module], Callable[[int], nn.Module]]]:
    """The (head, criterion) pairs `det-heads` compares: DETR's head as `det_coco.yaml` has
    it (100 queries, 1 group), with Group DETR and Plain-DETR's box bias, and the LW-DETR /
    RF-DETR head with one and three levels, at COCO settings by default (300 queries, 13
    groups); with `num_keypoints`, each followed by itself predicting that many keypoints."""
    heads = _box_heads(num_queries, num_groups)
    if not num_keypoints:
        return heads
    both = {}
    for name, (head, criterion) in heads.items():
        both[name] = (head, criterion)
        both[f"{name} +{num_keypoints} kpts"] = (partial(head, num_keypoints=num_keypoints), criterion)
    return both


def _box_heads(
    num_queries: int, num_groups: int
) -> dict[str, tuple[Callable[[int, int], nn.Module], Callable[[int], nn.Module]]]:
    from vitdense.heads import DETRHead, LWDETRHead, MultiLevelProjector
    from vitdense.losses import HungarianMatcher, IoUAwareBCELoss, SetCriterion

    queries = {"num_queries": num_queries, "num_groups": num_groups}
    # (Plain-DETR's 512-wide bias MLPs run on [B, G*Q, h + w, 512] per layer: at 640 px with
    # 13 x 300 queries, gigabytes; the demo's 64 keeps this row on a CPU)
    detr = partial(DETRHead, **queries, dropout=0.0, box_bias=True, box_bias_mode="pixels", box_bias_hidden=64)
    rf_detr = partial(SetCriterion, matcher=HungarianMatcher(cost_class=2.0), class_loss=IoUAwareBCELoss())
    p4 = partial(MultiLevelProjector, scale_factors=(1.0,))
    p3_p5 = partial(MultiLevelProjector, scale_factors=(2.0, 1.0, 0.5))
    return {
        "detr (det_coco.yaml)": (partial(DETRHead, num_queries=100), SetCriterion),
        "detr+groups+boxrpb": (detr, SetCriterion),
        "lwdetr P4 (RF-DETR-B)": (partial(LWDETRHead, neck=p4, **queries), rf_detr),
        "lwdetr P3-P5": (partial(LWDETRHead, neck=p3_p5, **queries), rf_detr),
    }


def bench_det_heads(args: argparse.Namespace) -> dict[str, tuple[float, float, float]]:
    """Median ms of a training step, its memory and median ms of inference (forward and the
    detections read at each image's size), per head, same backbone and batch."""
    from vitdense.tasks import BackboneConfig, DetectionTask
    from vitdense.types import ImageSizes

    torch.manual_seed(0)
    device = torch.device(args.device)
    backbone = BackboneConfig(name=args.model, img_size=args.img_size)
    tasks = {
        name: DetectionTask(num_classes=80, head=head, criterion=criterion, backbone=backbone).to(device).train()
        for name, (head, criterion) in detection_heads(args.num_queries, args.num_groups, args.keypoints).items()
        if not args.heads or name in args.heads
    }
    x = torch.randn(args.batch_size, 3, args.img_size, args.img_size, device=device)
    sizes = ImageSizes.full(args.batch_size, (args.img_size, args.img_size))
    targets = coco_like_targets(args.batch_size, 80, device, args.keypoints)

    def loss_of(name: str) -> torch.Tensor:
        task = tasks[name]
        return task.criterion(task(x, sizes), targets).total

    @torch.no_grad()
    def infer(name: str) -> None:
        with autocast(device, args.precision):
            model = tasks[name].model
            model.detections(model(x, sizes), sizes.sizes, torch.arange(args.batch_size))

    losses = {name: partial(loss_of, name) for name in tasks}
    timed = time_training_steps(losses, tasks, args)
    for task in tasks.values():
        task.eval()
    inference = {name: [] for name in tasks}
    for step in range(args.warmup + args.iters):
        for name in list(tasks) if step % 2 == 0 else list(tasks)[::-1]:
            seconds = time_call(partial(infer, name), device)
            if step >= args.warmup:
                inference[name].append(seconds)
    return {
        name: (seconds * 1000, memory, statistics.median(inference[name]) * 1000)
        for name, (seconds, memory) in timed.items()
    }


def print_det_heads(args: argparse.Namespace, results: dict[str, tuple[float, float, float]]) -> None:
    mem_label = memory_label(args.device)
    print(
        f"{args.model} at {args.img_size} x {args.img_size}, batch {args.batch_size}, {args.num_queries} queries x "
        f"{args.num_groups} groups, {args.precision}, training step "
        f"(forward, loss, backward) on {machine(args.device)} "
        f"({torch.get_num_threads()} threads, torch {torch.__version__}), median of {args.iters} alternating rounds; "
        "inference: eval forward and the detections read"
    )
    print(f"{'':32}{'train ms':>10}{'x first':>10}{mem_label:>16}{'infer ms':>10}{'x first':>10}")
    first, first_inference = next(iter(results.values()))[0], next(iter(results.values()))[2]
    for name, (ms, mb, infer_ms) in results.items():
        print(f"{name:32}{ms:10.0f}{ms / first:10.2f}{mb:16.0f}{infer_ms:10.1f}{infer_ms / first_inference:10.2f}")
