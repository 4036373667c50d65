"""`backbone`: vitdense's encoder against timm's `forward_features`, the same weights."""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import timm
import torch
from torch import nn

from vitdense.backbone import create_backbone
from vitdense.bench.common import autocast, machine, memory_label, saved_activation_bytes, time_call


def bench_backbone(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    torch.manual_seed(0)
    device = torch.device(args.device)
    img_size = (args.img_size, args.img_size)
    timm_model = timm.create_model(args.model, pretrained=False, num_classes=0, img_size=img_size)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "weights.pth"
        torch.save(timm_model.state_dict(), path)
        ours = create_backbone(args.model, checkpoint=path, img_size=img_size)
    models: dict[str, nn.Module] = {"vitdense": ours.to(device), "timm": timm_model.to(device)}
    if args.grad_checkpointing:
        for m in models.values():
            m.set_grad_checkpointing(True)
    prefix = timm_model.num_prefix_tokens
    x = torch.randn(args.batch_size, 3, *img_size, device=device)

    def loss_of(name: str) -> torch.Tensor:
        # the same reduction over every output token for both models
        if name == "vitdense":
            f = models[name](x)
            return f.patch_tokens.float().pow(2).mean() + f.prefix_tokens.float().pow(2).mean()
        out = models[name].forward_features(x).float()
        return out[:, prefix:].pow(2).mean() + out[:, :prefix].pow(2).mean()

    def infer(name: str) -> None:
        with torch.inference_mode(), autocast(device, args.precision):
            models[name].eval()
            loss_of(name)

    def train(name: str) -> None:
        models[name].train()
        with autocast(device, args.precision):
            loss = loss_of(name)
        loss.backward()
        models[name].zero_grad(set_to_none=True)

    results: dict[str, dict[str, float]] = {name: {} for name in models}
    for name in models:
        for _ in range(args.warmup):
            infer(name)
            train(name)
        models[name].train()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            train(name)
            results[name]["train_mem_mb"] = torch.cuda.max_memory_allocated() / 2**20
        else:
            with autocast(device, args.precision):
                saved = saved_activation_bytes(lambda n=name: loss_of(n))
            models[name].zero_grad(set_to_none=True)
            results[name]["train_mem_mb"] = saved / 2**20
    times: dict[tuple[str, str], list[float]] = {}
    order = list(models)
    for step in range(args.iters):
        for name in order if step % 2 == 0 else order[::-1]:
            times.setdefault((name, "infer"), []).append(time_call(lambda n=name: infer(n), device))
            times.setdefault((name, "train"), []).append(time_call(lambda n=name: train(n), device))
    for (name, kind), ts in times.items():
        results[name][f"{kind}_img_s"] = args.batch_size / statistics.median(ts)
    return results


def print_backbone(args: argparse.Namespace, results: dict[str, dict[str, float]]) -> None:
    mem_label = memory_label(args.device)
    print(
        f"{args.model} img {args.img_size} batch {args.batch_size} {args.precision}"
        f"{' grad-ckpt' if args.grad_checkpointing else ''} on {machine(args.device)}"
        f" ({torch.get_num_threads()} threads, torch {torch.__version__}, timm {timm.__version__}),"
        f" median of {args.iters} alternating rounds"
    )
    cols = [("infer_img_s", "infer img/s"), ("train_img_s", "train img/s"), ("train_mem_mb", mem_label)]
    print(f"{'':10}" + "".join(f"{label:>16}" for _, label in cols))
    for name in ("vitdense", "timm"):
        print(f"{name:10}" + "".join(f"{results[name][key]:16.2f}" for key, _ in cols))
    ratios = [results["vitdense"][key] / results["timm"][key] for key, _ in cols]
    print(f"{'ratio':10}" + "".join(f"{r:16.3f}" for r in ratios))
