"""`python -m vitdense.viz <command>`: the ViT paper's analyses (section 4.5) and DETR's and
Segmenter's views of their heads, on any vitdense checkpoint, timm-format weight file or
randomly initialised timm architecture. Each command writes PNG files (and, with
`--save-data`, the numbers behind them as .npy or .csv) and prints where.

    python -m vitdense.viz attention --ckpt_path runs/demo_cls/checkpoints/last.ckpt --images photos/
    python -m vitdense.viz rollout --weights vit_b16.safetensors --model vit_base_patch16_224 --images a.jpg
    python -m vitdense.viz attention-distance --ckpt_path ... --images imagenet/val --num-images 128
    python -m vitdense.viz pos-embed --ckpt_path ... [--grid 14x14]
    python -m vitdense.viz filters --weights ... --model ...
    python -m vitdense.viz decoder-attention --ckpt_path runs/demo_det/checkpoints/last.ckpt --images photos/
    python -m vitdense.viz class-masks --ckpt_path runs/demo_seg/checkpoints/last.ckpt --images photos/

`--ckpt_path` is a training checkpoint, as for `python -m vitdense validate|test|predict`;
`--weights` a backbone weight file, as `model.init_args.backbone.checkpoint` of `fit`.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from vitdense.backbone.vit import PatchEmbed
from vitdense.core.errors import ConfigError
from vitdense.core.safe_load import TRUST_FLAG
from vitdense.viz import analysis, figures
from vitdense.viz.load import Model, load_images, load_model, prepare, split_checkpoint


class Output:
    """Where a command writes: `<out>/<command>/`, every file printed."""

    def __init__(self, root: Path, command: str, save_data: bool) -> None:
        self.folder = root / command
        self.save_data = save_data
        self.written: list[Path] = []

    def figure(self, figure, name: str) -> None:
        self._note(figures.save(figure, self.folder / f"{name}.png"))

    def array(self, array: torch.Tensor | np.ndarray, name: str) -> None:
        if self.save_data:
            path = self.folder / f"{name}.npy"
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path, np.asarray(array.cpu() if isinstance(array, torch.Tensor) else array))
            self._note(path)

    def table(self, header: list[str], rows: list[list], name: str) -> None:
        if self.save_data:
            path = self.folder / f"{name}.csv"
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w", newline="") as f:
                csv.writer(f).writerows([header, *rows])
            self._note(path)

    def _note(self, path: Path) -> None:
        self.written.append(path)
        print(f"wrote {path}")


def _head(value: str) -> int | str:
    return int(value) if value.lstrip("-").isdigit() else value


def _grid(value: str) -> tuple[int, int]:
    try:
        h, w = (int(v) for v in value.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--grid {value!r}: expected HxW, e.g. 14x14") from None
    return h, w


# ---------------------------------------------------------------------------- commands
@torch.no_grad()
def attention(model: Model, args: argparse.Namespace, out: Output) -> None:
    """Class-token attention of one layer: one head, the mean/max/min over heads, or all."""
    backbone = model.backbone
    layer = args.layer % backbone.depth
    for name, image in load_images(args.images):
        features = backbone(prepare(image, model), attentions=[layer])
        maps = analysis.cls_attention(features.attentions[0], backbone.num_prefix_tokens, features.grid_size)[0]
        if args.head == "all":
            shown = torch.cat([maps, maps.mean(0, keepdim=True)])
            titles = [f"layer {layer + 1} head {h + 1}" for h in range(len(maps))] + [f"layer {layer + 1} mean"]
        else:
            shown = analysis.fuse_heads(maps[None], args.head)  # [1, h, w]
            titles = [f"layer {layer + 1} head {args.head if isinstance(args.head, str) else args.head + 1}"]
        out.figure(figures.attention_maps(image, shown, titles), name)
        out.array(shown, name)


@torch.no_grad()
def rollout(model: Model, args: argparse.Namespace, out: Output) -> None:
    """Attention rollout from the class token to every patch, through all layers."""
    backbone = model.backbone
    for name, image in load_images(args.images):
        features = backbone(prepare(image, model), attentions=range(backbone.depth))
        rolled = analysis.attention_rollout(features.attentions, args.head_fusion, residual=not args.no_residual)
        p = backbone.num_prefix_tokens
        if p < 1:
            raise ConfigError("the model has no class token (global-pool models): no class-token rollout to show")
        shown = rolled[0, 0, p:].reshape(1, *features.grid_size)
        title = f"rollout ({args.head_fusion} over heads{'' if not args.no_residual else ', no residual'})"
        out.figure(figures.attention_maps(image, shown, [title]), name)
        out.array(shown, name)


@torch.no_grad()
def attention_distance(model: Model, args: argparse.Namespace, out: Output) -> None:
    """Mean attention distance per head and layer over up to `--num-images` images."""
    backbone = model.backbone
    images = load_images(args.images)[: args.num_images]
    totals = torch.zeros(backbone.depth, backbone.num_heads, dtype=torch.float64)
    for start in range(0, len(images), args.batch_size):
        chunk = torch.cat([prepare(image, model) for _, image in images[start : start + args.batch_size]])
        features = backbone(chunk, attentions=range(backbone.depth))
        for layer, attn in enumerate(features.attentions):
            distance = analysis.mean_attention_distance(
                attn, backbone.num_prefix_tokens, features.grid_size, backbone.patch_size
            )
            totals[layer] += distance.cpu() * len(chunk)
    distances = totals / len(images)
    title = f"{Path(model.source).name}, {len(images)} images"
    out.figure(figures.attention_distance(distances, backbone.patch_size[0], model.img_size, title), "distance")
    rows = [
        [layer + 1, head + 1, f"{d:.4f}"] for layer, row in enumerate(distances.tolist()) for head, d in enumerate(row)
    ]
    out.table(["layer", "head", "mean_distance_px"], rows, "distance")


@torch.no_grad()
def pos_embed(model: Model, args: argparse.Namespace, out: Output) -> None:
    """Cosine similarities between the position embeddings, resampled to `--grid`."""
    backbone = model.backbone
    if backbone.pos_embed is None:
        raise ConfigError(f"{model.source}: the encoder has no learned position table (rotary embeddings only)")
    grid = args.grid or backbone.grid_size
    table = backbone.pos_embed_resampler.resample(backbone.pos_embed, grid)
    patch_pos = table[0, backbone.pos_embed_resampler.num_prefix_tokens :]
    similarity = analysis.pos_embed_similarity(patch_pos, grid)
    title = (
        f"{Path(model.source).name}, grid {grid[0]}x{grid[1]} (native {backbone.grid_size[0]}x{backbone.grid_size[1]})"
    )
    out.figure(figures.pos_embed_similarity(similarity, title), f"pos_embed_{grid[0]}x{grid[1]}")
    out.array(similarity, f"pos_embed_{grid[0]}x{grid[1]}")


@torch.no_grad()
def filters(model: Model, args: argparse.Namespace, out: Output) -> None:
    """Top principal components of the patch-embedding filters."""
    if not isinstance(model.backbone.patch_embed, PatchEmbed):
        raise ConfigError(
            "filters: this model's patch embedding has no pixel filters (a hybrid embeds ResNet features); "
            "the command needs a plain ViT"
        )
    components, explained = analysis.filter_components(model.backbone.patch_embed.proj.weight, args.components)
    out.figure(figures.filters(components, explained, Path(model.source).name), "filters")
    out.array(components, "filters")
    out.table(
        ["component", "explained_variance"], [[i + 1, f"{v:.6f}"] for i, v in enumerate(explained.tolist())], "filters"
    )


@torch.no_grad()
def decoder_attention(model: Model, args: argparse.Namespace, out: Output) -> None:
    """The last decoder layer's cross-attention of the most confident object queries."""
    task = _task(model, "decoder", "decoder-attention", "a detection checkpoint (DetectionTask with a DETRHead)")
    captured: list[torch.Tensor] = []
    layer = task.head.decoder[-1].cross_attn

    def ask_for_weights(module, args_, kwargs):  # the decoder asks only where explicit attention is faster
        return args_, {**kwargs, "need_weights": True, "average_attn_weights": True}

    hooks = [
        layer.register_forward_pre_hook(ask_for_weights, with_kwargs=True),
        layer.register_forward_hook(lambda module, inputs, output: captured.append(output[1])),
    ]
    try:
        for name, image in load_images(args.images):
            captured.clear()
            output = task(prepare(image, model))
            h, w = image.shape[:2]
            grid = model.backbone.patch_embed.grid_for(model.img_size, model.img_size)
            probs = output.logits[0].float().softmax(-1)[:, :-1]  # [Q, K], "no object" left out
            scores, labels = probs.max(-1)
            top = scores.argsort(descending=True)[: args.top]
            maps = captured[-1][0, top].reshape(len(top), *grid)
            cx, cy, bw, bh = output.boxes[0, top].float().unbind(-1)
            boxes = torch.stack([(cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w, (cy + bh / 2) * h], -1)
            captions = [
                f"query {q}: {task.class_names[c]} {s:.2f}"
                for q, c, s in zip(top.tolist(), labels[top].tolist(), scores[top].tolist(), strict=True)
            ]
            out.figure(figures.decoder_attention(image, maps, boxes, captions), name)
            out.array(maps, name)
    finally:
        for hook in hooks:
            hook.remove()


@torch.no_grad()
def class_masks(model: Model, args: argparse.Namespace, out: Output) -> None:
    """Each class's mask (softmax over classes, per patch) before the argmax, for the
    classes covering most of the image."""
    task = _task(model, "ignore_index", "class-masks", "a segmentation checkpoint (SegmentationTask)")
    for name, image in load_images(args.images):
        logits = task.head(model.backbone(prepare(image, model)))[0]  # [K, h, w]
        probs = logits.float().softmax(0)
        labels = probs.argmax(0)
        area = torch.bincount(labels.flatten(), minlength=len(probs))
        shown = area.argsort(descending=True)[: args.top]
        shown = shown[area[shown] > 0] if (area[shown] > 0).any() else shown[:1]
        titles = [f"{task.class_names[c]} ({100 * area[c] / labels.numel():.0f}%)" for c in shown.tolist()]
        out.figure(figures.class_masks(image, probs[shown], labels, titles), name)
        out.array(probs, name)


def _task(model: Model, attribute: str, command: str, wanted: str):
    task = model.task
    if task is None or not hasattr(task, attribute) and not hasattr(task.head, attribute):
        raise ConfigError(
            f"{command} needs {wanted}; {model.source} is {type(task).__name__ if task else 'bare weights'}"
        )
    return task


COMMANDS: dict[str, Callable[[Model, argparse.Namespace, Output], None]] = {
    "attention": attention,
    "rollout": rollout,
    "attention-distance": attention_distance,
    "pos-embed": pos_embed,
    "filters": filters,
    "decoder-attention": decoder_attention,
    "class-masks": class_masks,
}
NEEDS_IMAGES = {"attention", "rollout", "attention-distance", "decoder-attention", "class-masks"}


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(
        prog="python -m vitdense.viz", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = main.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.__doc__.splitlines()[0], description=command.__doc__)
        p.add_argument("--ckpt_path", help="a vitdense training checkpoint (.ckpt): its task and normalisation")
        p.add_argument("--weights", help="a backbone weight file: timm .safetensors/.pth/.bin or .npz (with --model)")
        p.add_argument(
            TRUST_FLAG,
            action="store_true",
            help="--weights is a file you trust: load it even if it holds Python objects that could run code",
        )
        p.add_argument("--checkpoint", help=argparse.SUPPRESS)  # deprecated: --ckpt_path or --weights
        p.add_argument("--model", help="timm name of the architecture (for weight files, or alone: random weights)")
        p.add_argument("--model-args", type=json.loads, default=None, help="timm overrides, e.g. '{\"depth\": 6}'")
        p.add_argument("--img-size", type=int, default=None, help="square input side (default: the model's)")
        p.add_argument("--out", type=Path, default=Path("viz"), help="output folder (default: viz/)")
        p.add_argument("--save-data", action="store_true", help="also save the numbers (.npy, .csv)")
        if name in NEEDS_IMAGES:
            p.add_argument("--images", nargs="+", required=True, help="image files and/or folders")
    options = sub.choices
    options["attention"].add_argument("--layer", type=int, default=-1, help="block index (default: the last)")
    options["attention"].add_argument(
        "--head", type=_head, default="mean", help="head index, mean, max, min or all (default: mean)"
    )
    options["rollout"].add_argument("--head-fusion", choices=["mean", "max", "min"], default="mean")
    options["rollout"].add_argument("--no-residual", action="store_true", help="leave out the identity")
    options["attention-distance"].add_argument("--num-images", type=int, default=128, help="(the paper: 128)")
    options["attention-distance"].add_argument("--batch-size", type=int, default=16)
    options["pos-embed"].add_argument("--grid", type=_grid, default=None, help="HxW (default: the native grid)")
    options["filters"].add_argument("--components", type=int, default=28, help="(the paper: 28)")
    options["decoder-attention"].add_argument("--top", type=int, default=6, help="queries shown, by score")
    options["class-masks"].add_argument("--top", type=int, default=8, help="classes shown, by area")
    return main


def main(argv: list[str] | None = None) -> list[Path]:
    """Run one command; returns the files written."""
    args = parser().parse_args(argv)
    try:
        ckpt_path, weights = args.ckpt_path, args.weights
        if args.checkpoint is not None:
            if ckpt_path is not None or weights is not None:
                raise ConfigError("--checkpoint is the old name of --ckpt_path and --weights: give one of the three")
            ckpt_path, weights = split_checkpoint(args.checkpoint, args.model)
            # argparse's own deprecation warnings name no replacement; this one names the right one
            warnings.warn(
                f"--checkpoint is deprecated: use {'--ckpt_path' if ckpt_path else '--weights'} {args.checkpoint}",
                FutureWarning,
                stacklevel=2,
            )
        model = load_model(ckpt_path, weights, args.model, args.model_args, args.img_size, args.trust_checkpoint)
        out = Output(args.out, args.command, args.save_data)
        COMMANDS[args.command](model, args, out)
    except (ConfigError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    return out.written
