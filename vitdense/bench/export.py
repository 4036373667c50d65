"""`export`: each task's exported ONNX graph in onnxruntime against eager PyTorch."""

from __future__ import annotations

import argparse
import statistics
import tempfile
from functools import partial
from pathlib import Path

import torch

from vitdense.bench.common import cpu_kind, time_call


def bench_export(args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    """Median ms per batch of `args.batch_size` images of the eager export wrapper (fp32,
    inference mode) and of onnxruntime on the ONNX file `python -m vitdense export` writes
    (height and width fixed to `args.img_size`; the batch dynamic as the command writes it,
    or fixed to 1 with `--no-dynamic-batch`), alternating, per task."""
    import onnxruntime

    from vitdense.deploy.export import exportable, save, trace
    from vitdense.tasks import BackboneConfig, ClassificationTask, DetectionTask, SegmentationTask

    model_args = {"depth": args.depth} if args.depth else None
    backbone = BackboneConfig(name=args.model, img_size=args.img_size, model_args=model_args)
    # built only when asked for: a DETR head is not free to build
    tasks = {
        "classification": lambda: ClassificationTask(num_classes=1000, backbone=backbone),
        "segmentation": lambda: SegmentationTask(num_classes=150, backbone=backbone),
        "detection": lambda: DetectionTask(num_classes=80, backbone=backbone),
    }
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, build in tasks.items():
            if name not in args.tasks:
                continue
            task = build()
            wrapper = exportable(task.model.eval(), [0.5] * 3, [0.5] * 3)
            outputs = ["boxes", "scores", "labels"] if name == "detection" else ["out"]
            path = Path(folder) / f"{name}.onnx"
            traced = trace(wrapper, args.img_size, args.img_size, dynamic=False, dynamic_batch=args.dynamic_batch)
            save(traced, wrapper, path, "onnx", outputs)
            session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            images = torch.rand(args.batch_size, 3, args.img_size, args.img_size) * 255
            feed = {"images": images.numpy()}
            times: dict[str, list[float]] = {"eager": [], "onnxruntime": []}
            with torch.inference_mode():
                for i in range(args.warmup + args.iters):
                    runs = {"eager": partial(wrapper, images), "onnxruntime": partial(session.run, None, feed)}
                    for kind, fn in runs.items():
                        elapsed = time_call(fn, torch.device("cpu"))
                        if i >= args.warmup:
                            times[kind].append(elapsed * 1000)
            results[name] = (statistics.median(times["eager"]), statistics.median(times["onnxruntime"]))
    return results


def print_export(args: argparse.Namespace, results: dict[str, tuple[float, float]]) -> None:
    graph = "a dynamic-batch graph" if args.dynamic_batch else "a batch-1 graph"
    print(
        f"{args.model} at {args.img_size} x {args.img_size}, batch {args.batch_size} ({graph}), fp32 on {cpu_kind()} "
        f"({torch.get_num_threads()} threads, torch {torch.__version__}), median ms of {args.iters} alternating rounds"
    )
    print(f"{'':16}{'eager ms':>12}{'onnxruntime ms':>16}{'eager / ort':>14}")
    for name, (eager, ort) in results.items():
        print(f"{name:16}{eager:12.1f}{ort:16.1f}{eager / ort:14.2f}")
