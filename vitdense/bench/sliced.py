"""`sliced`: what sliced inference (`vitdense.deploy.slicing`, SAHI's) gains where it matters: small
objects in large images, with the detection demo's model.

The images are the demo's scenes at another scale: its background (`textured_background`)
and its shapes (`draw_shape`, painted in the demo's light colours), on 2048 x 2048 pixels
with objects of 12-24 pixels (their tight box's longer side). The demo learned on images of
about 64 pixels whose objects span 15-55% of the side, about 10-35 pixels: a 64-pixel tile of
these images shows their objects at the scale it learned, while the whole image, resized to
64 pixels as the checkpoint's preprocessing says, shrinks them below a pixel.

Each setting predicts every image through `vitdense.load(ckpt, slicing=...)` and is scored by
pycocotools' COCOeval (bbox): AP, AP50 and AR_small (at 100 detections per image and class;
every object here is COCO-small), and the seconds per image (tiles, whole-image pass, merge).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from vitdense.bench.common import cpu_kind
from vitdense.data.synthetic.classification import SHAPES, draw_shape, textured_background
from vitdense.deploy.slicing import Slicing


@dataclass(frozen=True)
class Scene:
    """One generated image: pixels [H, W, 3] uint8, boxes [n, 4] (x1, y1, x2, y2) pixels,
    labels [n] (class indices), areas [n] (pixel counts)."""

    pixels: np.ndarray
    boxes: np.ndarray
    labels: np.ndarray
    areas: np.ndarray


def small_object_scene(
    size: int, num_objects: int, num_classes: int, rng: np.random.Generator, sides: tuple[int, int] = (12, 24)
) -> Scene:
    """`num_objects` shapes that do not overlap (nor touch: 2 pixels apart), each of a tight
    box whose longer side lies in `sides`, on the demo's background."""
    image = textured_background(size, rng)
    occupied = np.zeros((size, size), dtype=bool)
    boxes, labels, areas = [], [], []
    while len(boxes) < num_objects:
        label = int(rng.integers(0, num_classes))
        # draw_shape's shapes span 0.36-0.7 of their canvas: canvases of 17-67 pixels cover the sides asked
        canvas = int(rng.integers(round(sides[0] / 0.7), round(sides[1] / 0.36) + 1))
        shape = draw_shape(SHAPES[label], canvas, rng)
        ys, xs = np.nonzero(shape)
        if len(ys) < 16 or not sides[0] <= max(np.ptp(ys), np.ptp(xs)) + 1 <= sides[1]:
            continue
        y0, x0 = (int(v) for v in rng.integers(0, size - canvas + 1, 2))
        y1, y2, x1, x2 = y0 + ys.min(), y0 + ys.max() + 1, x0 + xs.min(), x0 + xs.max() + 1
        if occupied[max(0, y1 - 2) : y2 + 2, max(0, x1 - 2) : x2 + 2].any():
            continue
        occupied[y1:y2, x1:x2] = True
        image[y0 + ys, x0 + xs] = rng.uniform(0.65, 1.0, 3)  # (the demo's object colours)
        boxes.append([x1, y1, x2, y2])
        labels.append(label)
        areas.append(len(ys))
    pixels = np.round(image * 255).astype(np.uint8)
    return Scene(pixels, np.array(boxes, dtype=np.float32), np.array(labels), np.array(areas, dtype=np.float32))


def coco_scores(scenes: list[Scene], found: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> dict[str, float]:
    """pycocotools' AP, AP50 and AR_small of the detections `found`: per scene, boxes [k, 4]
    (x1, y1, x2, y2) pixels, scores [k], labels [k]."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    images, annotations, results = [], [], []
    for i, (scene, (boxes, scores, labels)) in enumerate(zip(scenes, found, strict=True)):
        height, width = scene.pixels.shape[:2]
        images.append({"id": i, "height": height, "width": width})
        for (x1, y1, x2, y2), label, area in zip(scene.boxes.tolist(), scene.labels, scene.areas, strict=True):
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": i,
                    "category_id": int(label),
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": float(area),
                    "iscrowd": 0,
                }
            )
        for (x1, y1, x2, y2), score, label in zip(boxes.tolist(), scores, labels, strict=True):
            results.append(
                {"image_id": i, "category_id": int(label), "bbox": [x1, y1, x2 - x1, y2 - y1], "score": float(score)}
            )
    classes = sorted({a["category_id"] for a in annotations} | {r["category_id"] for r in results})
    with contextlib.redirect_stdout(io.StringIO()):
        truth = COCO()
        truth.dataset = {"images": images, "annotations": annotations, "categories": [{"id": k} for k in classes]}
        truth.createIndex()
        if not results:
            return {"AP": 0.0, "AP50": 0.0, "AR_small": 0.0}
        evaluator = COCOeval(truth, truth.loadRes(results), "bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    stats = [max(0.0, float(s)) for s in evaluator.stats]  # (-1: no object of that size)
    return {"AP": stats[0], "AP50": stats[1], "AR_small": stats[9]}


def settings(args: argparse.Namespace) -> list[tuple[str, Slicing | None]]:
    """The table's rows: the whole image, then tiles of `--tile` with the merges compared."""
    tile = {"slice_height": args.tile, "overlap_height_ratio": args.overlap, "batch_size": args.slice_batch_size}
    tile["confidence_threshold"] = args.confidence_threshold
    name = f"tiles {args.tile}, overlap {args.overlap:g}"
    return [
        ("whole image (no slicing)", None),
        (f"{name}, GREEDYNMM IOS + whole image", Slicing(**tile)),
        (f"{name}, GREEDYNMM IOS", Slicing(**tile, perform_standard_pred=False)),
        (f"{name}, NMS IOU", Slicing(**tile, perform_standard_pred=False, postprocess_type="NMS", postprocess_match_metric="IOU")),
        (f"{name}, NMM IOS", Slicing(**tile, perform_standard_pred=False, postprocess_type="NMM")),
    ]  # fmt: skip


def bench_sliced(args: argparse.Namespace) -> list[tuple[str, dict[str, float]]]:
    """Each setting's scores and seconds per image. The tiles of an image are run once and
    merged as each row says (the rows differ only in their merge): a row's time is the tiles'
    forward passes, the whole image's when it has that pass, and its own merge."""
    import vitdense
    from vitdense.deploy.slicing import SlicedImage, merge_tiles, predict_tiles

    if args.threads:
        torch.set_num_threads(args.threads)
    predictor = vitdense.load(args.ckpt_path, batch_size=1, precision=args.precision)
    rng = np.random.default_rng(args.seed)
    scenes = [
        small_object_scene(args.size, args.objects, len(predictor.class_names), rng) for _ in range(args.num_images)
    ]
    rows = settings(args)
    found: dict[str, list] = {name: [] for name, _ in rows}
    seconds = dict.fromkeys(found, 0.0)
    tiles_only = replace(rows[1][1], perform_standard_pred=False)
    whole_as_a_tile = replace(tiles_only, slice_height=args.size, slice_width=args.size)
    predictor(scenes[0].pixels[: 2 * args.tile, : 2 * args.tile])  # (warm-up)
    for i, scene in enumerate(scenes):
        start = time.perf_counter()
        result = predictor(scene.pixels)
        seconds[rows[0][0]] += time.perf_counter() - start
        found[rows[0][0]].append((result.boxes, result.scores, result.labels))
        with torch.inference_mode(), predictor._autocast():
            start = time.perf_counter()
            tiles = predict_tiles(predictor.task, SlicedImage(scene.pixels, 0, predictor.sample, tiles_only))
            tiles_time = time.perf_counter() - start
            start = time.perf_counter()
            whole = predict_tiles(predictor.task, SlicedImage(scene.pixels, 0, predictor.sample, whole_as_a_tile))
            whole_time = time.perf_counter() - start
        for name, slicing in rows[1:]:
            start = time.perf_counter()
            parts = tiles + whole if slicing.perform_standard_pred else tiles
            boxes, scores, labels, _ = merge_tiles(parts, scene.pixels.shape[:2], slicing)
            seconds[name] += (
                time.perf_counter() - start + tiles_time + (whole_time if slicing.perform_standard_pred else 0)
            )
            found[name].append((boxes.numpy(), scores.numpy(), labels.numpy()))
        print(f"  image {i + 1}/{len(scenes)}: {len(tiles)} tiles in {tiles_time:.1f} s", flush=True)
    return [(name, {**coco_scores(scenes, found[name]), "s/img": seconds[name] / len(scenes)}) for name, _ in rows]


def print_sliced(rows: list[tuple[str, dict[str, float]]], args: argparse.Namespace) -> None:
    print(
        f"\n{args.num_images} images of {args.size} x {args.size}, {args.objects} objects of 12-24 px each "
        f"(seed {args.seed}); {args.ckpt_path}; {args.precision}; {cpu_kind()}, {torch.get_num_threads()} threads"
    )
    print("| setting | AP | AP50 | AR_small | s / image |\n|---|---|---|---|---|")
    for name, r in rows:
        print(
            f"| {name} | {100 * r['AP']:.1f} | {100 * r['AP50']:.1f} | {100 * r['AR_small']:.1f} | {r['s/img']:.2f} |"
        )
