"""`export-accuracy`: a trained checkpoint's exported graphs (ONNX fp32 and fp16, OpenVINO
f32, and bf16 where the CPU computes it) on the checkpoint's own validation split, beside
the eager model: the task's metric, the largest output difference, ms per image."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from vitdense.bench.common import cpu_kind
from vitdense.core.errors import ConfigError


@dataclass
class FormatResult:
    """One runtime's figures over the split."""

    metrics: dict[str, float]
    #: largest |output - eager output| over the split, per output name
    max_diff: dict[str, float] = field(default_factory=dict)
    ms: list[float] = field(default_factory=list)


def runners(wrapper, folder: Path, traced, outputs: list[str], formats: list[str]) -> tuple[Any, dict[str, Any]]:
    """Per format, a function images [1, 3, H, W] -> list of numpy outputs, files written in
    `folder`; and the ONNX export's `Traced` (fixed where its converter needed the fallback)."""
    import onnxruntime

    from vitdense.deploy.export import save
    from vitdense.deploy.runtimes import compile_openvino, onnx_to_openvino, to_half

    def eager(images):
        with torch.inference_mode():
            out = wrapper(images)
        return [x.numpy() for x in (out if isinstance(out, tuple) else (out,))]

    def session(path: Path, level=onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL):
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = level
        run = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run
        return lambda images: run(None, {"images": images.numpy()})

    def openvino(precision):
        compiled = compile_openvino(folder / "model.xml", precision)
        return lambda images: list(compiled(images.numpy()).values())

    written = save(traced, wrapper, folder / "model.onnx", "onnx", outputs)
    found = {"eager": eager}
    if "onnx" in formats:
        found["onnx"] = session(folder / "model.onnx")
    if "onnx-fp16" in formats:
        # onnxruntime 1.32 crashes (segfault) creating the session of the hybrid demos' float16 graph
        # (TorchScript's, with GELU decomposed) at ORT_ENABLE_ALL; EXTENDED leaves out only the layout passes
        extended = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        found["onnx-fp16"] = session(to_half(folder / "model.onnx", folder / "model-fp16.onnx"), extended)
    if any(f.startswith("openvino") for f in formats):
        onnx_to_openvino(folder / "model.onnx", folder / "model.xml")
    if "openvino" in formats:
        found["openvino"] = openvino("f32")
    if "openvino-bf16" in formats:
        found["openvino-bf16"] = openvino("bf16")
    return written, found


def pad_to(images: torch.Tensor, size: tuple[int, int], fill: torch.Tensor) -> torch.Tensor:
    """[1, 3, h, w] padded right and bottom to `size` with `fill` [1, 3, 1, 1] (the mean pixel:
    0 once normalised, what the collate pads with)."""
    h, w = images.shape[-2:]
    out = fill.expand(1, 3, *size).clone()
    out[..., :h, :w] = images
    return out


def bench_export_accuracy(args: argparse.Namespace) -> tuple[str, dict[str, FormatResult]]:
    """Each format over the validation split at batch 1 (formats alternate per image); returns
    the task family ("detection" or "segmentation") and the figures per format."""
    from vitdense.core.preprocess import InferenceData
    from vitdense.deploy.checkpoint import Checkpoint, load_task
    from vitdense.deploy.export import exportable, trace
    from vitdense.deploy.predictor import rebuild_datamodule
    from vitdense.deploy.runtimes import cpu_has_bf16
    from vitdense.tasks import DetectionTask, SegmentationTask

    found = Checkpoint(args.ckpt_path)
    task = load_task(found.path).eval()
    if isinstance(task, DetectionTask):
        family = "detection"
    elif isinstance(task, SegmentationTask):
        family = "segmentation"
    else:
        raise ConfigError(f"ckpt_path {found.path}: export-accuracy measures detection or segmentation tasks")
    if found.inference is not None:
        preprocess = InferenceData.from_data(found.inference).preprocess
        mean, std = preprocess.mean, preprocess.std
    else:
        mean, std = found.data["mean"], found.data["std"]
    wrapper = exportable(task.model, list(mean), list(std))
    datamodule = rebuild_datamodule(found)
    datamodule.setup("validate")
    dataset = datamodule.val_dataset
    count = min(len(dataset), args.limit) if args.limit else len(dataset)
    size = found.data.get("img_size") or 224
    traced = trace(wrapper, size, size)
    formats = [f for f in args.formats if f != "openvino-bf16" or cpu_has_bf16()]
    mean_px = torch.tensor(mean).view(1, 3, 1, 1) * 255
    std_px = torch.tensor(std).view(1, 3, 1, 1) * 255
    patch = task.model.backbone.patch_size
    metrics = {name: task.configure_metrics() for name in ["eager", *formats]}
    results = {name: FormatResult({}) for name in ["eager", *formats]}
    with tempfile.TemporaryDirectory() as folder:
        traced, run = runners(wrapper, Path(folder), traced, wrapper.output_names, formats)
        for index in range(count):
            sample = dataset[index]
            h, w = sample.image.shape[-2:]
            if traced.fixed_because is None:  # whole patches
                padded = (-(-h // patch[0]) * patch[0], -(-w // patch[1]) * patch[1])
            elif h <= traced.size[0] and w <= traced.size[1]:
                padded = traced.size
            else:
                raise ConfigError(
                    f"validation image {index} is {h} x {w}, larger than the fixed graph's {traced.size}"
                )  # fmt: skip
            # the graph's input: pixels 0..255, which it normalises back to the sample's image
            images = pad_to(sample.image[None] * std_px + mean_px, padded, mean_px)
            reference = None
            for name, fn in run.items():
                start = time.perf_counter()
                out = fn(images)
                results[name].ms.append(1000 * (time.perf_counter() - start))
                out = [torch.as_tensor(x) for x in out]
                if reference is None:
                    reference = out
                else:
                    for key, a, b in zip(wrapper.output_names, out, reference, strict=True):
                        diff = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
                        results[name].max_diff[key] = max(results[name].max_diff.get(key, 0.0), diff)
                update(metrics[name], family, out, sample, (h, w))
    for name, collection in metrics.items():
        computed = collection.compute()
        keys = ("map", "map_50") if family == "detection" else ("mIoU",)
        results[name].metrics = {k: float(computed[k]) for k in keys}
    return family, results


def update(metrics, family: str, out: list[torch.Tensor], sample, size: tuple[int, int]) -> None:
    """The task's metric on one image's graph outputs (as its `update_metrics` does on the
    model's): boxes scaled from the input's pixels to the original image, logits cropped to
    the image and resized to its label map (bilinear, as `Segmenter.segment`)."""
    h, w = size
    if family == "detection":
        boxes, scores, labels = (x[0] for x in out)
        h0, w0 = sample.orig_sizes
        boxes = boxes.float() * torch.tensor([w0 / w, h0 / h, w0 / w, h0 / h])
        truth = sample.eval_targets
        target = {"boxes": truth.boxes.float(), "labels": truth.labels, "iscrowd": truth.iscrowd, "area": truth.area}
        metrics["map"].update([{"boxes": boxes, "scores": scores.float(), "labels": labels.long()}], [target])
        return
    logits = out[0].float()[..., :h, :w]
    mask = sample.mask
    if tuple(logits.shape[-2:]) != tuple(mask.shape[-2:]):
        logits = F.interpolate(logits, size=tuple(mask.shape[-2:]), mode="bilinear", align_corners=False)
    metrics["seg"].update(logits.argmax(1), mask[None])


def print_export_accuracy(args: argparse.Namespace, family: str, results: dict[str, FormatResult]) -> None:
    names = {"map": "AP", "map_50": "AP50", "mIoU": "mIoU"}
    first = next(iter(results.values()))
    count = len(first.ms)
    print(
        f"{args.ckpt_path}: {family}, {count} validation images at batch 1 on {cpu_kind()} "
        f"({torch.get_num_threads()} threads, torch {torch.__version__}); max |diff| against eager, "
        "detections compared rank by rank; median ms per image, formats alternating"
    )
    metric_keys = list(first.metrics)
    diff_keys = list(next((r.max_diff for r in results.values() if r.max_diff), {}))
    header = "".join(f"{names[k]:>8}" for k in metric_keys) + "".join(f"{'|d| ' + k:>16}" for k in diff_keys)
    print(f"{'format':16}{header}{'ms':>10}")
    for name, result in results.items():
        row = "".join(f"{100 * result.metrics[k]:8.2f}" for k in metric_keys)
        row += "".join(f"{result.max_diff[k]:16.2g}" if k in result.max_diff else f"{'-':>16}" for k in diff_keys)
        print(f"{name:16}{row}{statistics.median(result.ms):10.1f}")
