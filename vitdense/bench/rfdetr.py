"""`rfdetr`: vitdense's LW-DETR detector against RF-DETR's own code (the `rfdetr` package),
the same size, on the same CPU: a training step, eager inference and onnxruntime latency.

rfdetr is not a dependency of vitdense: the command says how to install it when it is
missing (`pip install rfdetr`; it pins transformers 5 and pydantic 2, so a venv of its own
with vitdense installed into it is the clean way). Both detectors are built from rfdetr's
size config (`RFDETRNanoConfig`, ... `RFDETRBaseConfig`), field by field:

- backbone: rfdetr's windowed DINOv2 (ViT-S, no registers) -> vitdense's `VisionTransformer`
  of timm's `vit_small_patch14_dinov2` at the config's patch size and resolution; rfdetr's
  `out_feature_indexes` are HF stage numbers (stage i = the output of block i - 1), so the
  projector reads blocks i - 1; the blocks rfdetr windows (`compute_window_block_indexes`)
  are windowed in vitdense too, `num_windows` per side, the others attend globally;
- projector: `projector_scale` (P3 / P4 / P5) -> `MultiLevelProjector` scale factors 2 / 1 /
  0.5, C2f with 3 bottlenecks, LayerNorm;
- decoder: hidden_dim, sa_nheads, ca_nheads, dec_n_points, dec_layers, FFN 2048, dropout 0,
  num_queries x group_detr, two-stage, bbox_reparam, lite_refpoint_refine;
- loss: IA-BCE (alpha 0.25, gamma 2), matcher costs 2 / 5 / 2, loss weights 1 / 5 / 2, on
  every decoder layer and the two-stage proposals.

Both get random weights (rfdetr's DINOv2 download is skipped by naming a pretrain file its
builder does not read: `load_dinov2_weights` is `pretrain_weights is None`). Where the two
cannot be the same, the printout says so (parameter counts per part): rfdetr's DINOv2 has an
unused `mask_token` (384) and keeps its position table at 37 x 37 where the resolution is
not 37 patches (base: resampled to 40 x 40 in every forward; vitdense stores 40 x 40). Two
computational differences remain: rfdetr copies the class token into every window (vitdense's
windows share one), and rfdetr's ONNX graph ends at the queries' boxes and logits where
vitdense's includes the normalisation and the top-k post-processing.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from torch import nn

from vitdense.bench.common import alternating_rounds, autocast, cpu_kind

#: rfdetr's size configs the bench knows (`rfdetr.config`)
SIZES = {
    "nano": "RFDETRNanoConfig",
    "small": "RFDETRSmallConfig",
    "medium": "RFDETRMediumConfig",
    "base": "RFDETRBaseConfig",
}
#: rfdetr's encoder names -> the timm model whose architecture vitdense builds
ENCODERS = {"dinov2_windowed_small": "vit_small_patch14_dinov2", "dinov2_windowed_base": "vit_base_patch14_dinov2"}
#: rfdetr's projector levels -> `MultiLevelProjector` scale factors
LEVELS = {"P3": 2.0, "P4": 1.0, "P5": 0.5}


def rfdetr_missing() -> str | None:
    """How to install rfdetr when it cannot be imported, else None."""
    try:
        import rfdetr  # noqa: F401
    except ImportError:
        return (
            "the rfdetr bench compares with RF-DETR's own code, and rfdetr is not installed (it is not a vitdense "
            "dependency): pip install rfdetr (measured with 1.11.2), best into a venv of its own with vitdense: "
            "python -m venv rfvenv && rfvenv/bin/pip install -e . rfdetr onnx onnxruntime onnxscript"
        )
    return None


@dataclass(frozen=True)
class Layout:
    """One RF-DETR size, read off rfdetr's config: what both detectors are built with."""

    size: str
    encoder: str
    resolution: int
    patch_size: int
    num_windows: int
    feature_indexes: tuple[int, ...]  # vitdense's block indexes (rfdetr's stage numbers - 1)
    global_blocks: tuple[int, ...]
    scale_factors: tuple[float, ...]
    hidden_dim: int
    sa_nheads: int
    ca_nheads: int
    dec_n_points: int
    dec_layers: int
    num_queries: int
    group_detr: int
    two_stage: bool
    bbox_reparam: bool
    lite_refpoint_refine: bool
    num_select: int


def rfdetr_config(size: str, num_classes: int) -> object:
    """rfdetr's model config of `size` with `num_classes` logits (rfdetr adds one: it counts
    COCO's ids from 1), no pretrained weights read."""
    import rfdetr.config

    if size not in SIZES:
        raise SystemExit(f"vitdense.bench: error: --size {size}: expected one of {', '.join(SIZES)}")
    # a name, not None: rfdetr's builder downloads DINOv2 when pretrain_weights is None, and the
    # builder itself never reads this file (RFDETR.__init__ would; the bench does not call it)
    return getattr(rfdetr.config, SIZES[size])(num_classes=num_classes - 1, pretrain_weights="random-weights.pth")


def layout_of(size: str, config: object) -> Layout:
    from rfdetr.models.backbone.dinov2 import compute_window_block_indexes, get_config

    if config.encoder not in ENCODERS:
        raise SystemExit(f"vitdense.bench: error: rfdetr encoder {config.encoder!r} has no vitdense equivalent here")
    depth = get_config(config.encoder.split("_")[-1], use_registers=False)["num_hidden_layers"]
    windowed = set(compute_window_block_indexes(list(config.out_feature_indexes)))
    return Layout(
        size=size,
        encoder=config.encoder,
        resolution=config.resolution,
        patch_size=config.patch_size,
        num_windows=config.num_windows,
        feature_indexes=tuple(i - 1 for i in config.out_feature_indexes),
        global_blocks=tuple(i for i in range(depth) if i not in windowed),
        scale_factors=tuple(LEVELS[p] for p in config.projector_scale),
        hidden_dim=config.hidden_dim,
        sa_nheads=config.sa_nheads,
        ca_nheads=config.ca_nheads,
        dec_n_points=config.dec_n_points,
        dec_layers=config.dec_layers,
        num_queries=config.num_queries,
        group_detr=config.group_detr,
        two_stage=config.two_stage,
        bbox_reparam=config.bbox_reparam,
        lite_refpoint_refine=config.lite_refpoint_refine,
        num_select=config.num_select,
    )


def build_rfdetr(config: object) -> tuple[nn.Module, nn.Module, nn.Module]:
    """rfdetr's `LWDETR`, its `SetCriterion` and `PostProcess`, random weights."""
    from rfdetr.config import TrainConfig
    from rfdetr.models.lwdetr import build_criterion_from_config, build_model_from_config

    train = TrainConfig(dataset_dir=".", output_dir=".")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_model_from_config(config, train)
        criterion, postprocess = build_criterion_from_config(config, train)
    return model, criterion, postprocess


def build_vitdense(layout: Layout, num_classes: int) -> nn.Module:
    """vitdense's `DetectionTask` with `LWDETRHead` in rfdetr's `layout`, random weights."""
    from vitdense.heads import LWDETRHead, MultiLevelProjector
    from vitdense.losses import HungarianMatcher, IoUAwareBCELoss, SetCriterion
    from vitdense.tasks import BackboneConfig, DetectionTask

    neck = partial(
        MultiLevelProjector, feature_indexes=layout.feature_indexes, scale_factors=layout.scale_factors, num_blocks=3
    )
    head = partial(
        LWDETRHead,
        neck=neck,
        hidden_dim=layout.hidden_dim,
        num_queries=layout.num_queries,
        num_groups=layout.group_detr,
        num_heads=layout.sa_nheads,
        num_cross_heads=layout.ca_nheads,
        num_points=layout.dec_n_points,
        dim_feedforward=2048,
        dropout=0.0,
        dec_layers=layout.dec_layers,
        two_stage=layout.two_stage,
        bbox_reparam=layout.bbox_reparam,
        refine_references=not layout.lite_refpoint_refine,
    )
    criterion = partial(
        SetCriterion,
        loss_ce=1.0,
        loss_bbox=5.0,
        loss_giou=2.0,
        class_loss=IoUAwareBCELoss(alpha=0.25, gamma=2.0),
        matcher=HungarianMatcher(cost_class=2.0, cost_bbox=5.0, cost_giou=2.0),
    )
    model_args = {
        "patch_size": layout.patch_size,
        "num_windows": layout.num_windows,
        "global_attn_indexes": list(layout.global_blocks),
    }
    backbone = BackboneConfig(name=ENCODERS[layout.encoder], img_size=layout.resolution, model_args=model_args)
    return DetectionTask(
        num_classes=num_classes,
        head=head,
        criterion=criterion,
        selection="top_k",
        top_k=layout.num_select,
        backbone=backbone,
    )


def parameter_counts(rf: nn.Module, task: nn.Module) -> dict[str, tuple[int, int]]:
    """{part: (rfdetr's, vitdense's)} parameters: backbone, projector, decoder and heads."""

    def count(module: nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    rf_backbone = rf.backbone[0].encoder
    rf_projector = rf.backbone[0].projector
    model = task.model
    parts = {
        "backbone": (count(rf_backbone), count(model.backbone)),
        "projector": (count(rf_projector), count(model.head.neck)),
    }
    parts["decoder + heads"] = (
        count(rf) - parts["backbone"][0] - parts["projector"][0],
        count(model) - parts["backbone"][1] - parts["projector"][1],
    )
    parts["total"] = (count(rf), count(model))
    return parts


def random_targets(batch_size: int, num_classes: int) -> tuple[list, list[dict[str, torch.Tensor]]]:
    """The same 7 boxes per image (COCO's mean) as vitdense's `BoxTargets` and rfdetr's dicts."""
    from vitdense.bench.common import coco_like_targets

    ours = coco_like_targets(batch_size, num_classes, torch.device("cpu"))
    theirs = [{"labels": t.labels.clone(), "boxes": t.boxes.clone()} for t in ours]
    return ours, theirs


def training_steps(
    rf: nn.Module, criterion: nn.Module, task: nn.Module, args: argparse.Namespace, num_classes: int, resolution: int
) -> dict[str, Callable[[], None]]:
    """{name: a training step}: forward, loss, backward, gradient clipping (RF-DETR's 0.1),
    AdamW step, under the precision's autocast."""
    from vitdense.types import ImageSizes

    b = args.batch_size
    x = torch.randn(b, 3, resolution, resolution)
    sizes = ImageSizes.full(b, (resolution, resolution))
    ours, theirs = random_targets(b, num_classes)
    cpu = torch.device("cpu")
    rf.train()
    task.train()
    optimizers = {
        "rfdetr": torch.optim.AdamW(rf.parameters(), lr=1e-4, weight_decay=1e-4),
        "vitdense": torch.optim.AdamW(task.parameters(), lr=1e-4, weight_decay=1e-4),
    }

    def rf_loss() -> torch.Tensor:
        losses = criterion(rf(x, theirs), theirs)
        return sum(losses[k] * w for k, w in criterion.weight_dict.items() if k in losses)

    def vd_loss() -> torch.Tensor:
        return task.criterion(task(x, sizes), ours).total

    def step(name: str, module: nn.Module, loss_fn: Callable[[], torch.Tensor]) -> None:
        with autocast(cpu, args.precision):
            loss = loss_fn()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 0.1)
        optimizers[name].step()
        optimizers[name].zero_grad(set_to_none=True)

    return {"rfdetr": partial(step, "rfdetr", rf, rf_loss), "vitdense": partial(step, "vitdense", task, vd_loss)}


def inference_steps(
    rf: nn.Module, postprocess: nn.Module, task: nn.Module, args: argparse.Namespace, resolution: int
) -> dict[str, Callable[[], object]]:
    """{name: boxes of one image}: batch 1, evaluation, post-processed to the best
    `num_select` (query, class) pairs in pixels, under the precision's autocast."""
    x = torch.randn(1, 3, resolution, resolution)
    rf.eval()
    task.eval()
    cpu = torch.device("cpu")
    target_sizes = torch.tensor([[resolution, resolution]])

    def rf_detect() -> object:
        with torch.inference_mode(), autocast(cpu, args.precision):
            return postprocess(rf(x), target_sizes)

    def vd_detect() -> object:
        with torch.inference_mode(), autocast(cpu, args.precision):
            return task.model.detect(x)

    return {"rfdetr": rf_detect, "vitdense": vd_detect}


def onnx_sessions(
    rf: nn.Module, config: object, task: nn.Module, folder: Path, resolution: int
) -> dict[str, Callable[[], object]]:
    """{name: an onnxruntime run of one image}: rfdetr's own ONNX export (its `OnnxExporter`:
    TorchScript tracing, opset 17; outputs boxes and logits of the queries) and
    `vitdense.deploy.export`'s (the dynamo exporter; normalisation and top-k inside)."""
    import onnxruntime
    from rfdetr.export._onnx.exporter import OnnxConfig, OnnxExporter
    from rfdetr.export.prepare import prepare_export_graph

    from vitdense.deploy.export import exportable, save, trace

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = prepare_export_graph(copy.deepcopy(rf), config, shape=(resolution, resolution), device="cpu")
        rf_path = OnnxExporter(OnnxConfig(output_dir=folder, output_name="rfdetr", verbose=False))(graph)
        wrapper = exportable(task.model.eval(), [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
        vd_path = folder / "vitdense.onnx"
        save(
            trace(wrapper, resolution, resolution, dynamic=False), wrapper, vd_path, "onnx", list(wrapper.output_names)
        )
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    providers = ["CPUExecutionProvider"]
    rf_session = onnxruntime.InferenceSession(str(rf_path), options, providers=providers)
    vd_session = onnxruntime.InferenceSession(str(vd_path), options, providers=providers)
    normalized = {"input": torch.randn(1, 3, resolution, resolution).numpy()}
    pixels = {"images": (torch.rand(1, 3, resolution, resolution) * 255).numpy()}
    return {"rfdetr": partial(rf_session.run, None, normalized), "vitdense": partial(vd_session.run, None, pixels)}


def bench_rfdetr(args: argparse.Namespace) -> dict:
    """The parameter counts and the median ms of each measurement, per model."""
    from importlib.metadata import version

    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    config = rfdetr_config(args.size, args.num_classes)
    layout = layout_of(args.size, config)
    rf, criterion, postprocess = build_rfdetr(config)
    task = build_vitdense(layout, args.num_classes)
    results: dict = {"layout": layout, "params": parameter_counts(rf, task), "version": version("rfdetr")}
    r = layout.resolution
    if "train" in args.measure:
        steps = training_steps(rf, criterion, task, args, args.num_classes, r)
        results["train"] = alternating_rounds(steps, args.iters, args.warmup)
    if "infer" in args.measure:
        results["infer"] = alternating_rounds(inference_steps(rf, postprocess, task, args, r), args.iters, args.warmup)
    if "onnx" in args.measure:
        with tempfile.TemporaryDirectory() as folder:
            results["onnx"] = alternating_rounds(
                onnx_sessions(rf, config, task, Path(folder), r), args.iters, args.warmup
            )
    return results


def run_rfdetr(args: argparse.Namespace) -> None:
    if (message := rfdetr_missing()) is not None:
        print(f"vitdense.bench: error: {message}", file=sys.stderr)
        raise SystemExit(2)
    print_rfdetr(args, bench_rfdetr(args))


def print_rfdetr(args: argparse.Namespace, results: dict) -> None:
    import vitdense

    lay: Layout = results["layout"]
    levels = "/".join(f"P{4 - round(torch.tensor(s).log2().item())}" for s in lay.scale_factors)
    print(
        f"RF-DETR {lay.size}: {ENCODERS[lay.encoder]} patch {lay.patch_size} at {lay.resolution} x {lay.resolution}, "
        f"{lay.num_windows}x{lay.num_windows} windows (global blocks {list(lay.global_blocks)}), projector reads "
        f"blocks {list(lay.feature_indexes)} -> {levels}, {lay.dec_layers} decoder layers, {lay.num_queries} queries "
        f"x {lay.group_detr} groups, {args.num_classes} classes, random weights"
    )
    print(
        f"{cpu_kind()}, {torch.get_num_threads()} threads; torch {torch.__version__}, rfdetr {results['version']}, "
        f"vitdense {vitdense.__version__}; {args.precision}; median of {args.iters} alternating rounds"
    )
    print(f"{'parameters':28}{'rfdetr':>14}{'vitdense':>14}{'difference':>12}")
    for part, (theirs, ours) in results["params"].items():
        print(f"{part:28}{theirs:14,}{ours:14,}{ours - theirs:12,}")
    rows = {
        "train": f"training step, batch {args.batch_size}",
        "infer": "eager inference, batch 1",
        "onnx": "onnxruntime, batch 1",
    }
    print(f"{'ms (wall / process CPU)':28}{'rfdetr':>18}{'vitdense':>18}{'vitdense/rf':>14}")
    for key, label in rows.items():
        if key in results:
            (rf_wall, rf_cpu), (vd_wall, vd_cpu) = results[key]["rfdetr"], results[key]["vitdense"]
            ratio = f"{vd_wall / rf_wall:.2f} / {vd_cpu / rf_cpu:.2f}"
            print(f"{label:28}{rf_wall:9.0f} /{rf_cpu:7.0f}{vd_wall:9.0f} /{vd_cpu:7.0f}{ratio:>14}")
