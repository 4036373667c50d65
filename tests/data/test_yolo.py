"""YOLO-format data: the same samples as COCO's reader, the bad-input rules, the converter to
COCO JSON scored by COCOeval against the AP the CLI reports, instance masks from polygons."""

import json
import logging
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from vitdense.core.errors import DataError
from vitdense.data import (
    COCODataModule,
    LoaderConfig,
    YoloDetectionDataModule,
    YoloInstanceMaskDataModule,
    write_synthetic_coco,
    yolo_to_coco,
)
from vitdense.data.yolo import main as yolo_main
from vitdense.data.yolo import read_yolo

SMALL = dict(
    img_size=48,
    scales=[48],
    max_size=None,
    crop_scales=[48],
    crop_size=(32, 48),
    eval_short_side=48,
    loader=LoaderConfig(batch_size=2, num_workers=0),
)
NAMES = ["circle", "square", "triangle"]
#: COCOeval summarize's 12 figures, in its order
SUMMARY = ["map", "map_50", "map_75", "map_small", "map_medium", "map_large"]
SUMMARY += ["mar_1", "mar_10", "mar_100", "mar_small", "mar_medium", "mar_large"]


def coco_as_yolo(coco_root: Path, split: str, root: Path, yolo_split: str) -> None:
    """The synthetic COCO split in YOLO's layout: the same images, each box as a normalised
    `class cx cy w h` line; an image without objects gets no label file (the first) or an
    empty one (the others)."""
    data = json.loads((coco_root / "annotations" / f"instances_{split}.json").read_text())
    label_of = {c["id"]: k for k, c in enumerate(sorted(data["categories"], key=lambda c: c["id"]))}
    (root / "images" / yolo_split).mkdir(parents=True)
    (root / "labels" / yolo_split).mkdir(parents=True)
    unlabelled = False
    for img in data["images"]:
        shutil.copy(coco_root / split / img["file_name"], root / "images" / yolo_split / img["file_name"])
        w, h = img["width"], img["height"]
        lines = [
            f"{label_of[a['category_id']]} {(x + bw / 2) / w!r} {(y + bh / 2) / h!r} {bw / w!r} {bh / h!r}"
            for a in data["annotations"]
            if a["image_id"] == img["id"]
            for x, y, bw, bh in [a["bbox"]]
        ]
        if not lines and not unlabelled:
            unlabelled = True
            continue
        (root / "labels" / yolo_split / img["file_name"]).with_suffix(".txt").write_text("\n".join(lines))


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> tuple[Path, Path]:
    """(the synthetic shapes as COCO, the same as YOLO with data.yaml's names as a dict)."""
    coco, yolo = tmp_path_factory.mktemp("coco"), tmp_path_factory.mktemp("yolo")
    for split, yolo_split, n in (("train2017", "train", 4), ("val2017", "val", 6)):
        write_synthetic_coco(coco, split, n, img_size=48, num_classes=3, seed=1)
        coco_as_yolo(coco, split, yolo, yolo_split)
    data = {"path": ".", "train": "images/train", "val": "images/val", "names": dict(enumerate(NAMES))}
    (yolo / "data.yaml").write_text(yaml.safe_dump(data))
    return coco, yolo


def test_samples_are_the_coco_readers(shapes):
    coco_root, yolo_root = shapes
    theirs = COCODataModule(root=str(coco_root), **SMALL)
    mine = YoloDetectionDataModule(root=str(yolo_root), **SMALL)
    assert (mine.num_classes, mine.class_names, mine.category_ids) == (3, NAMES, [0, 1, 2])
    theirs.setup("validate")
    mine.setup("validate")
    assert len(mine.val_dataset) == len(theirs.val_dataset) == 6
    assert mine.val_dataset.image_ids == theirs.val_dataset.image_ids  # 1.. in file order, as the synthetic JSON's
    objects = 0
    for a, b in zip(mine.val_dataset, theirs.val_dataset, strict=True):
        assert torch.equal(a.image, b.image) and a.orig_sizes == b.orig_sizes
        torch.testing.assert_close(a.targets.boxes, b.targets.boxes, atol=1e-6, rtol=0)
        assert torch.equal(a.targets.labels, b.targets.labels)
        torch.testing.assert_close(a.eval_targets.boxes, b.eval_targets.boxes, atol=1e-4, rtol=0)
        assert torch.equal(a.eval_targets.labels, b.eval_targets.labels)
        assert torch.equal(a.eval_targets.iscrowd, b.eval_targets.iscrowd)
        objects += len(a.targets.labels)
    assert objects > 6


def test_converter_and_its_command_line(shapes, tmp_path, capsys):
    _, root = shapes
    out = tmp_path / "val.json"
    yolo_main(["to-coco", "--root", str(root), "--split", "val", "--out", str(out)])
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(yolo_to_coco(root, "val")))
    assert [c["id"] for c in written["categories"]] == [0, 1, 2] and "6 images" in capsys.readouterr().out
    first = written["annotations"][0]
    img = written["images"][first["image_id"] - 1]
    line = (root / "labels" / "val" / img["file_name"]).with_suffix(".txt").read_text().splitlines()[0]
    cls, cx, cy, w, h = map(float, line.split())
    expected = [(cx - w / 2) * img["width"], (cy - h / 2) * img["height"], w * img["width"], h * img["height"]]
    assert (
        first["category_id"] == cls
        and np.allclose(first["bbox"], expected)
        and first["area"] == pytest.approx(expected[2] * expected[3])
    )
    with pytest.raises(SystemExit):
        yolo_main(["to-coco", "--root", str(tmp_path), "--out", str(out)])
    assert "data.yaml not found" in capsys.readouterr().err


def small_dataset(root: Path, labels: dict[str, str], names=("a", "b"), **yaml_entries) -> Path:
    """Images `<name>.png` (40 x 32, width x height) with the given label files' text (None:
    no label file) in YOLO's layout."""
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
    for name, text in labels.items():
        Image.new("RGB", (40, 32), (90, 20, 200)).save(root / "images" / "val" / f"{name}.png")
        if text is not None:
            (root / "labels" / "val" / f"{name}.txt").write_text(text)
    data = {"train": "images/train", "val": "images/val", "names": list(names), **yaml_entries}
    (root / "data.yaml").write_text(yaml.safe_dump({k: v for k, v in data.items() if v is not None}))
    return root


@pytest.mark.parametrize(
    "text, message",
    [
        ("0 0.5 0.5 0.2\n", "x.txt:1: 4 fields; expected `class cx cy w h`"),
        ("0 0.5 0.5 0.2 0.2\n1 0.5 0.5 0.2 0.2 0.9\n", "x.txt:2: 6 fields"),
        ("0 0.5 0.5 0.2 0.2\n\n0 0.5 half 0.2 0.2\n", "x.txt:3: '0 0.5 half 0.2 0.2' is not all numbers"),
        ("2 0.5 0.5 0.2 0.2\n", "x.txt:1: class 2 is not a class index 0..1"),
        ("0.5 0.5 0.5 0.2 0.2\n", "x.txt:1: class 0.5 is not a class index"),
        ("0 0.5 0.5 -0.2 0.2\n", "x.txt:1: negative box width or height"),
        ("0 0.95 0.5 0.2 0.2\n", "x.txt:1: coordinates reach 0.4..1.05, outside [0, 1]"),
        ("1 0.1 0.1 0.9 0.1 120 80\n", "x.txt:1: coordinates reach 0.1..120, outside [0, 1]"),
    ],
)
def test_bad_label_lines_name_the_file_and_line(tmp_path, text, message):
    root = small_dataset(tmp_path, {"x": text})
    with pytest.raises(DataError, match=re.escape(str(root / "labels" / "val") + "/") + ".*" + re.escape(message)):
        yolo_to_coco(root, "val")


@pytest.mark.parametrize(
    "change, error, message",
    [
        (lambda p: p.unlink(), FileNotFoundError, "data.yaml: YOLO data.yaml not found; expected layout"),
        (lambda p: p.write_text("train: images/train\nval: images/val\n"), DataError, "data.yaml: no 'names'"),
        (
            lambda p: p.write_text("names: {0: a, 2: b}\nval: images/val\n"),
            DataError,
            "expected the class indices 0..1",
        ),
        (lambda p: p.write_text("names: [a, b]\nnc: 3\nval: images/val\n"), DataError, "nc is 3 but 'names' lists 2"),
        (
            lambda p: p.write_text("names: [a]\ntrain: images/train\n"),
            DataError,
            "no 'val' entry; add `val: images/val`",
        ),
        (lambda p: p.write_text("names: [a]\nval: val.txt\n"), DataError, "not lists of folders or .txt lists"),
    ],
)
def test_bad_data_yaml(tmp_path, change, error, message):
    root = small_dataset(tmp_path, {"x": "0 0.5 0.5 0.2 0.2\n"})
    change(root / "data.yaml")
    with pytest.raises(error, match=re.escape(message)):
        yolo_to_coco(root, "val")


def test_counted_cases(tmp_path, caplog):
    """Within the tolerance: clipped; no label file, an empty one: no objects; a label file
    without an image: skipped; each counted in the log."""
    root = small_dataset(
        tmp_path, {"clip": "1 0.5 0.5 1.01 0.5\n0 0.1 0.1 0.2 0.2\n", "none": None, "empty": "", "blank": "\n \n"}
    )
    (root / "labels" / "val" / "gone.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    with caplog.at_level(logging.INFO, logger="vitdense.data.yolo"):
        read = read_yolo(root, "val")
    assert read.counts == {"unlabelled": 1, "empty": 2, "orphans": 1, "clipped": 1, "rotated": 0}
    assert [img["file_name"] for img in read.coco["images"]] == ["blank.png", "clip.png", "empty.png", "none.png"]
    assert [a["image_id"] for a in read.coco["annotations"]] == [2, 2]
    assert read.coco["annotations"][0]["bbox"] == pytest.approx([0, 8, 40, 16])  # clipped to the 40 px width
    assert read.sources == [f"{root}/labels/val/clip.txt:1", f"{root}/labels/val/clip.txt:2"]
    assert "4 images, 2 objects; 1 images without a label file and 2 with an empty one" in caplog.text
    assert "1 label files without an image skipped (e.g. gone.txt)" in caplog.text
    assert "1 objects with coordinates up to 0.01 outside [0, 1] clipped" in caplog.text


def test_instance_masks_from_polygons(tmp_path):
    square = "1 0.25 0.25 0.75 0.25 0.75 0.75 0.25 0.75\n"  # 20 x 16 px on the 40 x 32 image
    root = small_dataset(tmp_path, {"p": square + "0 0 0 0.5 0 0 0.5\n", "q": None})
    dm = YoloInstanceMaskDataModule(root=str(root), img_size=32, loader=LoaderConfig(batch_size=1, num_workers=0))
    assert (dm.class_names, dm.category_ids, dm.is_thing) == (["a", "b"], [0, 1], [True, True])
    dm.setup("validate")
    sample = dm.val_dataset[0]
    masks = sample.eval_targets.masks
    assert masks.shape == (2, 32, 40) and sample.eval_targets.labels.tolist() == [1, 0]
    assert masks[0].sum() == 20 * 16 and masks[0, 8:24, 10:30].all()
    assert sample.eval_targets.area.tolist() == [320.0, pytest.approx(masks[1].sum().item())]
    assert len(dm.val_dataset[1].eval_targets.labels) == 0
    (root / "labels" / "val" / "q.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    dm = YoloInstanceMaskDataModule(root=str(root), img_size=32)
    with pytest.raises(DataError, match=re.escape(f"{root}/labels/val/q.txt:1: a box")):
        dm.setup("validate")


def test_categories_from_a_checkpoint_need_no_dataset(tmp_path):
    dm = YoloDetectionDataModule(root=str(tmp_path / "none"), categories={0: "a", 1: "b"}, **SMALL)
    assert dm.class_names == ["a", "b"] and dm.hparams["categories"] == {0: "a", 1: "b"}


@pytest.fixture(scope="module")
def through_the_cli(shapes, tmp_path_factory):
    """A tiny DetectionTask fitted 2 steps on the YOLO shapes through the CLI, then `test`
    and `predict` (COCO results JSON) from its checkpoint: (test metrics, results file)."""
    from vitdense.cli import main

    _, root = shapes
    folder = tmp_path_factory.mktemp("cli")
    head = {"class_path": "vitdense.heads.DETRHead"}
    head["init_args"] = dict(hidden_dim=32, num_heads=2, dim_feedforward=64, num_queries=10, dec_layers=1, dropout=0.0)
    model = {"head": head, "backbone": {"name": "vit_tiny_patch16_224", "model_args": {"depth": 1}}}
    data = {"root": str(root), **{k: v for k, v in SMALL.items() if k != "loader"}, "crop_size": [32, 48]}
    data["loader"] = {"batch_size": 2, "num_workers": 0}
    config = {
        "seed_everything": 0,
        "trainer": {"accelerator": "cpu", "default_root_dir": str(folder), "enable_progress_bar": False},
        "model": {"class_path": "vitdense.tasks.DetectionTask", "init_args": model},
        "data": {"class_path": "vitdense.data.YoloDetectionDataModule", "init_args": data},
    }
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    fit = main(["fit", "--config", str(path), "--trainer.max_steps=2", "--trainer.limit_val_batches=1"])
    assert fit.trainer.global_step == 2
    (ckpt,) = (folder / "lightning_logs").rglob("*.ckpt")
    tested = main(["test", "--config", str(path), f"--ckpt_path={ckpt}"])
    out = folder / "detections.json"
    args = ["predict", "--config", str(path), f"--ckpt_path={ckpt}"]
    args += [
        "--trainer.callbacks+=vitdense.training.callbacks.COCOResultsWriter",
        f"--trainer.callbacks.output_file={out}",
    ]
    main([*args, "--trainer.callbacks.score_threshold=0"])
    return {k: float(v) for k, v in tested.trainer.callback_metrics.items()}, out


def test_cocoeval_on_the_converted_json_equals_the_reported_ap(through_the_cli, shapes, tmp_path):
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    metrics, results_file = through_the_cli
    _, root = shapes
    gt_file = tmp_path / "val.json"
    gt_file.write_text(json.dumps(yolo_to_coco(root, "val")))
    gt = COCO(str(gt_file))
    results = json.loads(results_file.read_text())
    assert {r["image_id"] for r in results} == set(gt.getImgIds()) and {r["category_id"] for r in results} <= {0, 1, 2}
    evaluation = COCOeval(gt, gt.loadRes(str(results_file)), "bbox")
    evaluation.evaluate()
    evaluation.accumulate()
    evaluation.summarize()
    reported = [metrics[f"test/{k}"] for k in SUMMARY]
    np.testing.assert_allclose(reported, evaluation.stats, atol=1e-6)  # (2 steps: AP 0; the area ranges' -1 agree)


def test_cocoeval_on_the_converted_json_equals_detection_mean_ap(shapes, tmp_path):
    """The task's metric (DetectionMeanAP on the DataModule's evaluation targets, as
    DetectionTask.update_metrics feeds it) against COCOeval on the converter's JSON, for the
    same detections: the ground truth jittered, rescored, some relabelled, plus false ones."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    from vitdense.metrics.detection import DetectionMeanAP

    _, root = shapes
    dm = YoloDetectionDataModule(root=str(root), **SMALL)
    dm.setup("validate")
    rng = np.random.default_rng(0)
    metric = DetectionMeanAP(box_format="xyxy", iou_type="bbox", class_metrics=True)
    results = []
    for i, sample in enumerate(dm.val_dataset):
        truth = sample.eval_targets
        n = len(truth.labels)
        boxes = truth.boxes + torch.from_numpy(rng.normal(0, 1.5, (n, 4))).float()
        boxes = torch.cat([boxes, torch.tensor([[2.0, 2.0, 20.0, 20.0]])])  # a false detection per image
        labels = torch.cat(
            [
                torch.where(torch.from_numpy(rng.random(n) < 0.2), (truth.labels + 1) % 3, truth.labels),
                torch.tensor([1]),
            ]
        )
        scores = torch.from_numpy(rng.random(n + 1)).float()
        metric.update(
            [{"boxes": boxes, "scores": scores, "labels": labels}],
            [{"boxes": truth.boxes, "labels": truth.labels, "iscrowd": truth.iscrowd, "area": truth.area}],
        )
        for (x1, y1, x2, y2), score, label in zip(boxes.tolist(), scores.tolist(), labels.tolist(), strict=True):
            image_id = dm.val_dataset.image_ids[i]
            results.append(
                {
                    "image_id": image_id,
                    "category_id": dm.category_ids[label],
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "score": score,
                }
            )
    gt_file = tmp_path / "val.json"
    gt_file.write_text(json.dumps(yolo_to_coco(root, "val")))
    gt = COCO(str(gt_file))
    evaluation = COCOeval(gt, gt.loadRes(results), "bbox")
    evaluation.evaluate()
    evaluation.accumulate()
    evaluation.summarize()
    ours = metric.compute()
    np.testing.assert_allclose([float(ours[k]) for k in SUMMARY], evaluation.stats, atol=1e-6)
    assert 0.1 < evaluation.stats[0] < 0.95  # a real comparison, neither 0 nor perfect
