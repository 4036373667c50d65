"""`backbone`: vitdense's encoder against timm's `forward_features`, the same weights."""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import timm
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

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
    # distance to the limit: the model's counted FLOPs at the measured rate, against a large
    # GEMM's rate on the same threads and dtype
    flops = {"infer": counted_flops(lambda: infer("timm")), "train": counted_flops(lambda: train("timm"))}
    peak = gemm_peak_flops(device, args.precision, args.gemm_size)
    for name in models:
        for kind in ("infer", "train"):
            rate = flops[kind] / args.batch_size * results[name][f"{kind}_img_s"]
            results[name][f"{kind}_peak_pct"] = 100 * rate / peak
    results["_peak"] = {"gflops": peak / 1e9, "infer_gflop_img": flops["infer"] / args.batch_size / 1e9}
    return results


def counted_flops(step: Callable[[], object]) -> float:
    """Floating-point operations of one call of `step`, counted by torch's FlopCounterMode
    (matrix products and convolutions, 2 per multiply-add; what a GEMM peak is measured in)."""
    counter = FlopCounterMode(display=False)
    with counter:
        step()
    return float(counter.get_total_flops())


def gemm_peak_flops(device: torch.device, precision: str, n: int = 2048, rounds: int = 5) -> float:
    """FLOP/s of an n x n x n matrix product on `device` in the precision's dtype, best of
    `rounds`: the practical peak the model's rate is a fraction of."""
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b  # warm-up (oneDNN's first call builds its kernel)
    best = min(time_call(lambda: a @ b, device) for _ in range(rounds))
    return 2 * n**3 / best


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
    peak = results["_peak"]
    print(
        f"distance to the limit: {peak['infer_gflop_img']:.2f} GFLOP per image forward (FlopCounterMode), "
        f"{args.precision} GEMM peak {peak['gflops']:.0f} GFLOP/s ({torch.get_num_threads()} threads, {args.gemm_size}^3)"
    )
    print(f"{'% of peak':10}{'infer':>16}{'train':>16}")
    for name in ("vitdense", "timm"):
        print(f"{name:10}" + "".join(f"{results[name][f'{k}_peak_pct']:15.1f}%" for k in ("infer", "train")))
