"""`train-step`: a task's training step against the design a user would otherwise run
(`vitdense.bench.peers`)."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import timm
import torch
import torch.nn.functional as F
from torch import nn

from vitdense.bench.common import coco_like_targets, machine, memory_label, time_training_steps


def train_step_pair(
    args: argparse.Namespace,
) -> tuple[dict[str, Callable[[], torch.Tensor]], dict[str, nn.Module]]:
    """({"vitdense": loss_fn, peer name: loss_fn}, the models by those names): one training
    batch's loss for `args.task`, from vitdense's task (its forward_batch and compute_loss,
    as `fit` runs them) and from the design a user would otherwise run
    (`vitdense.bench.peers`), their backbones with the same weights."""
    from vitdense.bench.peers import DETRPeer, SegmenterPeer
    from vitdense.tasks import BackboneConfig, ClassificationTask, DetectionTask, SegmentationTask
    from vitdense.types import DetectedImages, ImageSizes, LabeledImages, SegmentedImages

    torch.manual_seed(0)
    device = torch.device(args.device)
    b, size, k = args.batch_size, args.img_size, args.num_classes
    timm_vit = timm.create_model(
        args.model, pretrained=False, num_classes=k if args.task == "cls" else 0, img_size=size
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "weights.pth"
        torch.save(timm_vit.state_dict(), path)
        backbone = BackboneConfig(
            name=args.model, img_size=size, checkpoint=str(path), grad_checkpointing=args.grad_checkpointing
        )
        timm_vit.set_grad_checkpointing(args.grad_checkpointing)
        task_class = {"cls": ClassificationTask, "seg": SegmentationTask, "det": DetectionTask}[args.task]
        task = task_class(num_classes=k, backbone=backbone)
    task, sizes = task.to(device).train(), ImageSizes.full(b, (size, size))
    x = torch.randn(b, 3, size, size, device=device)
    g = torch.Generator().manual_seed(0)
    if args.task == "cls":
        batch = LabeledImages(x, torch.randint(k, (b,), generator=g).to(device), image_sizes=sizes)
        peer_name, peer = "timm", timm_vit.to(device).train()
        peer_loss = lambda: F.cross_entropy(peer(x), batch.label)  # noqa: E731
    elif args.task == "seg":
        masks = torch.randint(k, (b, size, size), generator=g).to(device)
        batch = SegmentedImages(x, masks, image_sizes=sizes, mask_sizes=sizes)
        peer_name, peer = "Segmenter design", SegmenterPeer(timm_vit, k).to(device).train()
        peer_loss = partial(peer.step, x, masks)
    else:
        targets = coco_like_targets(b, k, device)
        batch = DetectedImages(x, tuple(targets), image_sizes=sizes)
        peer_name, peer = "DETR design", DETRPeer(timm_vit, k).to(device).train()
        peer_loss = partial(peer.step, x, [(t.boxes, t.labels) for t in targets])
    models = {"vitdense": task, peer_name: peer}

    def ours() -> torch.Tensor:
        return task.compute_loss(task.forward_batch(batch, "train"), batch, "train").total

    return {"vitdense": ours, peer_name: peer_loss}, models


def bench_train_step(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Median images/s of a training step (forward, loss, backward) and its memory, vitdense
    vs the peer design, alternating every round."""
    timed = time_training_steps(*train_step_pair(args), args)
    return {name: {"img_s": args.batch_size / seconds, "mem_mb": memory} for name, (seconds, memory) in timed.items()}


def print_train_step(args: argparse.Namespace, results: dict[str, dict[str, float]]) -> None:
    print(
        f"{args.task} training step, {args.model} at {args.img_size} x {args.img_size}, batch {args.batch_size}, "
        f"{args.num_classes} classes, {args.precision}{', grad-ckpt' if args.grad_checkpointing else ''}, "
        f"on {machine(args.device)} ({torch.get_num_threads()} threads, torch {torch.__version__}, "
        f"timm {timm.__version__}), median of {args.iters} alternating rounds"
    )
    mem_label = memory_label(args.device)
    print(f"{'':18}{'img/s':>10}{mem_label:>16}")
    for name, row in results.items():
        print(f"{name:18}{row['img_s']:10.2f}{row['mem_mb']:16.0f}")
    ours, peer = results["vitdense"], next(v for k, v in results.items() if k != "vitdense")
    print(f"{'ratio':18}{ours['img_s'] / peer['img_s']:10.3f}{ours['mem_mb'] / peer['mem_mb']:16.3f}")
