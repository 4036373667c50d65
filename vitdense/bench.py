"""Benchmarks that print figures and the ratio against the peer they measure.

    python -m vitdense.bench backbone --model vit_small_patch16_224 --img-size 224 --batch-size 8
    python -m vitdense.bench export --model vit_small_patch16_224 --img-size 224
    python -m vitdense.bench det-heads --model vit_small_patch16_224 --img-size 640 --batch-size 2
    python -m vitdense.bench eval --images 5000
    python -m vitdense.bench data --config configs/demo_det.yaml --workers 0 1 2
    python -m vitdense.bench train-step --task seg --model vit_small_patch16_224 --img-size 512

`backbone` times vitdense's encoder against timm's `forward_features` with the same
weights, in one process, alternating the two every round so that drift of the machine
(thermal, other load) hits both alike. It reports the median images/s of inference and of
a training step (forward + backward), the memory of the training step, and
vitdense / timm for each. Memory is the peak allocated on CUDA; on CPU, where torch keeps
no allocator statistics, it is the size of the activations autograd saves for backward
(the part of training memory that depends on the implementation).

`det-heads` times a detection training step (forward, the task's loss, backward) of each
detection head on the same backbone at a COCO-like size, alternating the heads every round:
median ms, saved-activation MB (CPU) or peak MB (CUDA), and the ratio to the first head.

`train-step` times a task's training step (forward, loss, backward) against the design a
user would otherwise run (`vitdense.bench_peers`: timm for classification, Segmenter's for
segmentation, DETR's for detection), the same backbone weights and inputs, alternating:
median images/s, memory, and vitdense / peer.

`data` times a config's training data pipeline (its DataModule, as the CLI builds it) in
samples/s for each number of loader workers, so `loader.num_workers` can be set from it.

`eval` times COCO's AP with per-class figures on a synthetic set (5,000 images, 100
detections each, 80 classes): COCOeval run directly (all classes at once), torchmetrics'
`MeanAveragePrecision(class_metrics=True)` (COCOeval once, then again per class) and
vitdense's `DetectionMeanAP` (COCOeval once, per-class figures from its arrays), per backend.

`export` times each task's exported graph (`python -m vitdense export`, fixed size, batch 1)
in onnxruntime against the same wrapper in eager PyTorch, alternating, median ms.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import timm
import torch
import torch.nn.functional as F
from torch import nn

from vitdense.backbone import create_backbone

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def _autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    dtype = PRECISIONS[precision]
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def _saved_activation_bytes(step: Callable[[], torch.Tensor]) -> int:
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


def _time(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


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
        with torch.inference_mode(), _autocast(device, args.precision):
            models[name].eval()
            loss_of(name)

    def train(name: str) -> None:
        models[name].train()
        with _autocast(device, args.precision):
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
            with _autocast(device, args.precision):
                saved = _saved_activation_bytes(lambda n=name: loss_of(n))
            models[name].zero_grad(set_to_none=True)
            results[name]["train_mem_mb"] = saved / 2**20
    times: dict[tuple[str, str], list[float]] = {}
    order = list(models)
    for step in range(args.iters):
        for name in order if step % 2 == 0 else order[::-1]:
            times.setdefault((name, "infer"), []).append(_time(lambda n=name: infer(n), device))
            times.setdefault((name, "train"), []).append(_time(lambda n=name: train(n), device))
    for (name, kind), ts in times.items():
        results[name][f"{kind}_img_s"] = args.batch_size / statistics.median(ts)
    return results


def print_backbone(args: argparse.Namespace, results: dict[str, dict[str, float]]) -> None:
    mem_label = "train mem MB" if args.device.startswith("cuda") else "saved act. MB"
    print(
        f"{args.model} img {args.img_size} batch {args.batch_size} {args.precision}"
        f"{' grad-ckpt' if args.grad_checkpointing else ''} on {args.device}"
        f" ({torch.get_num_threads()} threads, torch {torch.__version__}, timm {timm.__version__}),"
        f" median of {args.iters} alternating rounds"
    )
    cols = [("infer_img_s", "infer img/s"), ("train_img_s", "train img/s"), ("train_mem_mb", mem_label)]
    print(f"{'':10}" + "".join(f"{label:>16}" for _, label in cols))
    for name in ("vitdense", "timm"):
        print(f"{name:10}" + "".join(f"{results[name][key]:16.2f}" for key, _ in cols))
    ratios = [results["vitdense"][key] / results["timm"][key] for key, _ in cols]
    print(f"{'ratio':10}" + "".join(f"{r:16.3f}" for r in ratios))


def cpu_kind() -> str:
    """The CPU model and the capability torch uses (e.g. "AMD EPYC, AVX512")."""
    name = "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    return f"{name}, {torch.backends.cpu.get_cpu_capability()}"


def bench_export(args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    """Median ms per image, batch 1, of the eager export wrapper (fp32, inference mode) and of
    onnxruntime on the ONNX file `python -m vitdense export` writes, alternating, per task."""
    import onnxruntime

    from vitdense.export import exportable, save, trace
    from vitdense.tasks import BackboneConfig, ClassificationTask, DetectionTask, SegmentationTask

    backbone = BackboneConfig(name=args.model, img_size=args.img_size)
    tasks = {
        "classification": ClassificationTask(num_classes=1000, backbone=backbone),
        "segmentation": SegmentationTask(num_classes=150, backbone=backbone),
        "detection": DetectionTask(num_classes=80, backbone=backbone),
    }
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, task in tasks.items():
            if name not in args.tasks:
                continue
            wrapper = exportable(task.model.eval(), [0.5] * 3, [0.5] * 3)
            outputs = ["boxes", "scores", "labels"] if name == "detection" else ["out"]
            path = Path(folder) / f"{name}.onnx"
            save(trace(wrapper, args.img_size, args.img_size, dynamic=False), wrapper, path, "onnx", outputs)
            session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            images = torch.rand(1, 3, args.img_size, args.img_size) * 255
            feed = {"images": images.numpy()}
            times: dict[str, list[float]] = {"eager": [], "onnxruntime": []}
            with torch.inference_mode():
                for i in range(args.warmup + args.iters):
                    runs = {"eager": partial(wrapper, images), "onnxruntime": partial(session.run, None, feed)}
                    for kind, fn in runs.items():
                        elapsed = _time(fn, torch.device("cpu"))
                        if i >= args.warmup:
                            times[kind].append(elapsed * 1000)
            results[name] = (statistics.median(times["eager"]), statistics.median(times["onnxruntime"]))
    return results


def print_export(args: argparse.Namespace, results: dict[str, tuple[float, float]]) -> None:
    print(
        f"{args.model} at {args.img_size} x {args.img_size}, batch 1, fp32 on {cpu_kind()} ({torch.get_num_threads()} "
        f"threads, torch {torch.__version__}), median ms of {args.iters} alternating rounds"
    )
    print(f"{'':16}{'eager ms':>12}{'onnxruntime ms':>16}{'eager / ort':>14}")
    for name, (eager, ort) in results.items():
        print(f"{name:16}{eager:12.1f}{ort:16.1f}{eager / ort:14.2f}")


def detection_heads(
    num_queries: int = 300, num_groups: int = 13
) -> dict[str, tuple[Callable[[int, int], nn.Module], Callable[[int], nn.Module]]]:
    """The (head, criterion) pairs `det-heads` compares: DETR's head as `det_coco.yaml` has
    it (100 queries, 1 group), with Group DETR and Plain-DETR's box bias, and the LW-DETR /
    RF-DETR head with one and three levels, at COCO settings by default (300 queries, 13
    groups)."""
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


def bench_det_heads(args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    """Median ms of a training step and its memory, per head, same backbone and batch."""
    from vitdense.tasks import BackboneConfig, DetectionTask
    from vitdense.types import ImageSizes

    torch.manual_seed(0)
    device = torch.device(args.device)
    backbone = BackboneConfig(name=args.model, img_size=args.img_size)
    tasks = {
        name: DetectionTask(num_classes=80, head=head, criterion=criterion, backbone=backbone).to(device).train()
        for name, (head, criterion) in detection_heads(args.num_queries, args.num_groups).items()
        if not args.heads or name in args.heads
    }
    x = torch.randn(args.batch_size, 3, args.img_size, args.img_size, device=device)
    sizes = ImageSizes.full(args.batch_size, (args.img_size, args.img_size))
    targets = coco_like_targets(args.batch_size, 80, device)

    def loss_of(name: str) -> torch.Tensor:
        task = tasks[name]
        return task.criterion(task(x, sizes), targets).total

    losses = {name: partial(loss_of, name) for name in tasks}
    timed = time_training_steps(losses, tasks, args)
    return {name: (seconds * 1000, memory) for name, (seconds, memory) in timed.items()}


def coco_like_targets(batch_size: int, num_classes: int, device: torch.device) -> list:
    """`BoxTargets` of 7 objects per image (COCO's mean), centres in [0.2, 0.8], sides in
    [0.05, 0.35], seeded."""
    from vitdense.types import BoxTargets

    generator = torch.Generator().manual_seed(0)
    targets = []
    for _ in range(batch_size):
        centre = torch.rand(7, 2, generator=generator) * 0.6 + 0.2
        size = torch.rand(7, 2, generator=generator) * 0.3 + 0.05
        labels = torch.randint(num_classes, (7,), generator=generator)
        targets.append(BoxTargets(torch.cat([centre, size], 1).to(device), labels.to(device)))
    return targets


def time_training_steps(
    losses: dict[str, Callable[[], torch.Tensor]], models: dict[str, nn.Module], args: argparse.Namespace
) -> dict[str, tuple[float, float]]:
    """{name: (median seconds of a training step — `losses[name]()` under autocast, then
    backward —, its memory in MB)}: `args.warmup` steps each, then `args.iters` rounds taking
    the models in turn, the order reversed every other round. Memory: the CUDA peak, or on
    CPU the activations autograd saves."""
    device = torch.device(args.device)

    def train(name: str) -> None:
        with _autocast(device, args.precision):
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
            with _autocast(device, args.precision):
                memory[name] = _saved_activation_bytes(losses[name]) / 2**20
            models[name].zero_grad(set_to_none=True)
    times: dict[str, list[float]] = {name: [] for name in losses}
    order = list(losses)
    for step in range(args.iters):
        for name in order if step % 2 == 0 else order[::-1]:
            times[name].append(_time(lambda n=name: train(n), device))
    return {name: (statistics.median(ts), memory[name]) for name, ts in times.items()}


def print_det_heads(args: argparse.Namespace, results: dict[str, tuple[float, float]]) -> None:
    mem_label = "peak MB" if args.device.startswith("cuda") else "saved act. MB"
    print(
        f"{args.model} at {args.img_size} x {args.img_size}, batch {args.batch_size}, {args.num_queries} queries x "
        f"{args.num_groups} groups, {args.precision}, training step "
        f"(forward, loss, backward) on {cpu_kind() if args.device == 'cpu' else args.device} "
        f"({torch.get_num_threads()} threads, torch {torch.__version__}), median of {args.iters} alternating rounds"
    )
    print(f"{'':24}{'ms':>10}{'x first':>10}{mem_label:>16}")
    first = next(iter(results.values()))[0]
    for name, (ms, mb) in results.items():
        print(f"{name:24}{ms:10.0f}{ms / first:10.2f}{mb:16.0f}")


def train_step_pair(
    args: argparse.Namespace,
) -> tuple[dict[str, Callable[[], torch.Tensor]], dict[str, nn.Module]]:
    """({"vitdense": loss_fn, peer name: loss_fn}, the models by those names): one training
    batch's loss for `args.task`, from vitdense's task (its forward_batch and compute_loss,
    as `fit` runs them) and from the design a user would otherwise run
    (`vitdense.bench_peers`), their backbones with the same weights."""
    from vitdense.bench_peers import DETRPeer, SegmenterPeer
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
        if args.task == "cls":
            task = ClassificationTask(num_classes=k, backbone=backbone)
        elif args.task == "seg":
            task = SegmentationTask(num_classes=k, backbone=backbone)
        else:
            task = DetectionTask(num_classes=k, backbone=backbone)
    task, sizes = task.to(device).train(), ImageSizes.full(b, (size, size))
    x = torch.randn(b, 3, size, size, device=device)
    g = torch.Generator().manual_seed(0)
    if args.task == "cls":
        batch = LabeledImages(x, torch.randint(k, (b,), generator=g).to(device), image_sizes=sizes)
        peer_name, peer = "timm", timm_vit.to(device).train()
        peer_loss = partial(lambda m: F.cross_entropy(m(x), batch.label), peer)
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
    where = cpu_kind() if args.device == "cpu" else torch.cuda.get_device_name(args.device)
    print(
        f"{args.task} training step, {args.model} at {args.img_size} x {args.img_size}, batch {args.batch_size}, "
        f"{args.num_classes} classes, {args.precision}{', grad-ckpt' if args.grad_checkpointing else ''}, on {where} ({torch.get_num_threads()} threads, torch "
        f"{torch.__version__}, timm {timm.__version__}), median of {args.iters} alternating rounds"
    )
    mem_label = "peak MB" if args.device.startswith("cuda") else "saved act. MB"
    print(f"{'':18}{'img/s':>10}{mem_label:>16}")
    for name, row in results.items():
        print(f"{name:18}{row['img_s']:10.2f}{row['mem_mb']:16.0f}")
    ours, peer = results["vitdense"], next(v for k, v in results.items() if k != "vitdense")
    print(f"{'ratio':18}{ours['img_s'] / peer['img_s']:10.3f}{ours['mem_mb'] / peer['mem_mb']:16.3f}")


def bench_data(args: argparse.Namespace) -> dict[int, float]:
    """{workers: training samples per second} of the DataModule in `args.config`'s `data`
    section (built as the CLI builds it), over `args.batches` batches after the first (worker
    start-up excluded)."""
    import dataclasses

    import yaml
    from jsonargparse import ArgumentParser
    from lightning import LightningDataModule

    parser = ArgumentParser()
    parser.add_argument("--data", type=LightningDataModule)
    section = yaml.safe_load(Path(args.config).read_text())["data"]
    for override in args.set or []:  # key=value under init_args, e.g. root=/data/coco
        key, value = override.split("=", 1)
        section.setdefault("init_args", {})[key] = yaml.safe_load(value)
    parsed = parser.parse_object({"data": section})
    datamodule = getattr(parser, "instantiate", parser.instantiate_classes)(parsed).data
    datamodule.prepare_data()
    datamodule.setup("fit")
    results = {}
    for workers in args.workers:
        datamodule.loader = dataclasses.replace(datamodule.loader, num_workers=workers)
        batches = iter(datamodule.train_dataloader())
        next(batches)
        start, samples = time.perf_counter(), 0
        for _, batch in zip(range(args.batches), batches, strict=False):  # (or until the epoch ends)
            samples += int(batch.image.shape[0])
        results[workers] = samples / (time.perf_counter() - start)
        del batches
    return results


def print_data(args: argparse.Namespace, results: dict[int, float]) -> None:
    print(f"training samples/s of {args.config}'s data, {args.batches} batches after the first, on {cpu_kind()}")
    print(f"{'workers':>8}{'samples/s':>12}{'per worker':>12}")
    for workers, rate in results.items():
        print(f"{workers:8d}{rate:12.1f}{rate / max(workers, 1):12.1f}")


def synthetic_detections(
    num_images: int, num_classes: int, detections: int, seed: int = 0
) -> tuple[list[dict], list[dict]]:
    """(predictions, targets) in torchmetrics' format (xyxy pixels) for `num_images` 640 x 480
    images: 7 objects each (COCO's mean), `detections` scored boxes each, a third of them
    near an object (a trained detector's mix of hits and misses)."""
    g = torch.Generator().manual_seed(seed)
    preds, targets = [], []
    size = torch.tensor([640.0, 480.0, 640.0, 480.0])
    for _ in range(num_images):
        xy = torch.rand(7, 2, generator=g) * 0.7
        wh = torch.rand(7, 2, generator=g) * 0.25 + 0.02
        boxes = torch.cat([xy, xy + wh], 1) * size
        labels = torch.randint(num_classes, (7,), generator=g)
        hits = detections // 3
        found = torch.randint(7, (hits,), generator=g)  # the objects hit, each a few pixels off
        near = boxes[found] + torch.randn(hits, 4, generator=g) * 8
        xy = torch.rand(detections - hits, 2, generator=g) * 0.8
        far = torch.cat([xy, xy + torch.rand(detections - hits, 2, generator=g) * 0.2 + 0.01], 1) * size
        det_boxes = torch.cat([near, far]).clamp(min=0)
        det_boxes[:, 2:] = torch.maximum(det_boxes[:, 2:], det_boxes[:, :2] + 1)
        det_labels = torch.cat([labels[found], torch.randint(num_classes, (detections - hits,), generator=g)])
        # hits score higher on average, as a detector's do
        scores = torch.cat([torch.rand(hits, generator=g) * 0.5 + 0.5, torch.rand(detections - hits, generator=g)])
        preds.append({"boxes": det_boxes, "scores": scores, "labels": det_labels})
        targets.append({"boxes": boxes, "labels": labels})
    return preds, targets


def cocoeval_directly(preds: list[dict], targets: list[dict], backend: str) -> tuple[float, float]:
    """(seconds, AP) of `backend`'s COCOeval run directly on the same boxes (COCO's xywh), as
    COCO's own scripts run it: the dataset and results built in memory, evaluate, accumulate,
    summarize; all classes at once (no per-class figures)."""
    import io

    if backend == "faster_coco_eval":
        from faster_coco_eval import COCO
        from faster_coco_eval import COCOeval_faster as COCOeval
    else:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
    start = time.perf_counter()
    images, annotations, results = [], [], []
    for i, (p, t) in enumerate(zip(preds, targets, strict=True)):
        images.append({"id": i, "width": 640, "height": 480})
        for box, label in zip(t["boxes"].tolist(), t["labels"].tolist(), strict=True):
            w, h = box[2] - box[0], box[3] - box[1]
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": i,
                    "category_id": label,
                    "bbox": [box[0], box[1], w, h],
                    "area": w * h,
                    "iscrowd": 0,
                }
            )
        for box, score, label in zip(p["boxes"].tolist(), p["scores"].tolist(), p["labels"].tolist(), strict=True):
            results.append(
                {
                    "image_id": i,
                    "category_id": label,
                    "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]],
                    "score": score,
                }
            )
    categories = sorted({a["category_id"] for a in annotations} | {r["category_id"] for r in results})
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO()
        gt.dataset = {"images": images, "annotations": annotations, "categories": [{"id": c} for c in categories]}
        gt.createIndex()
        evaluator = COCOeval(gt, gt.loadRes(results), "bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return time.perf_counter() - start, float(evaluator.stats[0])


def bench_eval(args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    """(seconds, AP) of each way to get COCO's AP with per-class figures on the same set."""
    from torchmetrics.detection import MeanAveragePrecision

    from vitdense.metrics import DetectionMeanAP

    preds, targets = synthetic_detections(args.images, args.classes, args.detections)
    results = {}
    for backend in args.backends:
        results[f"COCOeval ({backend}), no per-class"] = cocoeval_directly(preds, targets, backend)
        metrics = {
            f"torchmetrics ({backend})": MeanAveragePrecision(class_metrics=True, backend=backend),
            f"vitdense DetectionMeanAP ({backend})": DetectionMeanAP(class_metrics=True, backend=backend),
        }
        for name, metric in metrics.items():
            start = time.perf_counter()
            metric.update(preds, targets)
            ap = float(metric.compute()["map"])
            results[name] = (time.perf_counter() - start, ap)
    return results


def print_eval(args: argparse.Namespace, results: dict[str, tuple[float, float]]) -> None:
    print(
        f"COCO AP (bbox) of {args.images} images, 7 objects and {args.detections} detections each, {args.classes} "
        f"classes, per-class AP on except where said, on {cpu_kind()} (one process)"
    )
    first = next(iter(results.values()))[0]
    print(f"{'':44}{'seconds':>10}{'speed-up':>10}{'AP':>10}")
    for name, (seconds, ap) in results.items():
        print(f"{name:44}{seconds:10.1f}{first / seconds:10.2f}{ap:10.4f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vitdense.bench", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    bb = sub.add_parser("backbone", help="vitdense encoder vs timm forward_features, same weights")
    bb.add_argument("--model", default="vit_small_patch16_224", help="timm model name")
    bb.add_argument("--img-size", type=int, default=224)
    bb.add_argument("--batch-size", type=int, default=8)
    bb.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32", help="autocast dtype")
    bb.add_argument("--grad-checkpointing", action="store_true")
    bb.add_argument("--iters", type=int, default=10, help="timed rounds per model")
    bb.add_argument("--warmup", type=int, default=2)
    bb.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ex = sub.add_parser("export", help="eager vs onnxruntime latency of each task's exported graph, batch 1")
    ex.add_argument("--model", default="vit_small_patch16_224", help="timm model name (random weights)")
    ex.add_argument("--img-size", type=int, default=224)
    ex.add_argument("--tasks", nargs="+", default=["classification", "segmentation", "detection"])
    ex.add_argument("--iters", type=int, default=10, help="timed rounds per runtime")
    ex.add_argument("--warmup", type=int, default=2)
    dh = sub.add_parser("det-heads", help="training-step time and memory of each detection head, same backbone")
    dh.add_argument("--model", default="vit_small_patch16_224", help="timm model name (random weights)")
    dh.add_argument("--img-size", type=int, default=640)
    dh.add_argument("--batch-size", type=int, default=2)
    dh.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32", help="autocast dtype")
    dh.add_argument("--heads", nargs="*", default=None, help="a subset of the heads, by name")
    dh.add_argument("--num-queries", type=int, default=300, help="queries per group")
    dh.add_argument("--num-groups", type=int, default=13, help="Group DETR groups in training")
    dh.add_argument("--iters", type=int, default=5, help="timed rounds per head")
    dh.add_argument("--warmup", type=int, default=1)
    dh.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ts = sub.add_parser("train-step", help="a task's training step vs the design a user would otherwise run")
    ts.add_argument("--task", choices=["cls", "seg", "det"], required=True)
    ts.add_argument("--model", default="vit_small_patch16_224", help="timm model name (random weights)")
    ts.add_argument("--img-size", type=int, default=None, help="default: cls 224, seg 512, det 512")
    ts.add_argument("--batch-size", type=int, default=2)
    ts.add_argument("--num-classes", type=int, default=None, help="default: cls 1000, seg 150, det 80")
    ts.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32", help="autocast dtype")
    ts.add_argument("--grad-checkpointing", action="store_true", help="in both backbones")
    ts.add_argument("--iters", type=int, default=6, help="timed rounds per model")
    ts.add_argument("--warmup", type=int, default=1)
    ts.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    da = sub.add_parser("data", help="training samples/s of a config's DataModule, per number of loader workers")
    da.add_argument("--config", required=True, help="a vitdense YAML; its data section is used")
    da.add_argument("--set", nargs="*", help="data init_args overrides, key=value (e.g. root=/data/ade)")
    da.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    da.add_argument("--batches", type=int, default=20)
    ev = sub.add_parser("eval", help="COCO AP with per-class figures: vitdense vs torchmetrics vs COCOeval directly")
    ev.add_argument("--images", type=int, default=5000)
    ev.add_argument("--detections", type=int, default=100, help="detections per image")
    ev.add_argument("--classes", type=int, default=80)
    ev.add_argument("--backends", nargs="+", default=["pycocotools", "faster_coco_eval"])
    args = parser.parse_args(argv)
    if args.command == "backbone":
        print_backbone(args, bench_backbone(args))
    elif args.command == "export":
        print_export(args, bench_export(args))
    elif args.command == "det-heads":
        print_det_heads(args, bench_det_heads(args))
    elif args.command == "train-step":
        defaults = {"cls": (224, 1000), "seg": (512, 150), "det": (512, 80)}[args.task]
        args.img_size = args.img_size or defaults[0]
        args.num_classes = args.num_classes or defaults[1]
        print_train_step(args, bench_train_step(args))
    elif args.command == "data":
        print_data(args, bench_data(args))
    elif args.command == "eval":
        print_eval(args, bench_eval(args))


if __name__ == "__main__":
    main()
