"""COCO-format data: category mapping, crowds, clipping, checks of malformed JSON, transforms."""

import json
import logging
import re

import numpy as np
import pytest
import torch
from PIL import Image

from vitdense.core.errors import DataError
from vitdense.data import (
    COCODataModule,
    CocoDetection,
    LoaderConfig,
    SyntheticDetectionDataModule,
    load_coco,
    pad_collate,
    write_synthetic_coco,
)
from vitdense.data.transforms.detection import detection_eval_transforms, detection_train_transforms, short_side_size

MEAN = STD = (0.5, 0.5, 0.5)


def write_coco(root, split="val2017", num_images=6):
    """A tiny dataset in COCO 2017's layout (the synthetic shapes, category ids 1, 3, 5)."""
    return write_synthetic_coco(root, split, num_images, img_size=48, num_classes=3, seed=1)


def edit(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_categories_map_to_contiguous_labels_and_back(tmp_path):
    path = write_coco(tmp_path)
    index = load_coco(path, tmp_path / "val2017")
    assert index.category_ids == [1, 3, 5] and index.class_names == ["circle", "square", "triangle"]
    data = json.loads(path.read_text())
    first = data["annotations"][0]
    image = next(img for img in index.images if img.id == first["image_id"])
    label = {1: 0, 3: 1, 5: 2}[first["category_id"]]
    assert label in image.labels.tolist()
    assert len(index.images) == len(data["images"])  # images without objects are kept


def test_crowds_kept_for_evaluation_only_and_boxes_clipped(tmp_path, caplog):
    path = write_coco(tmp_path)

    def add(data):
        img = data["images"][0]
        w = img["width"]
        data["annotations"] += [
            {"id": 901, "image_id": img["id"], "category_id": 3, "bbox": [1, 1, 10, 10], "area": 80.0, "iscrowd": 1},
            {"id": 902, "image_id": img["id"], "category_id": 1, "bbox": [w - 5, 2, 20, 8], "area": 40.0, "iscrowd": 0},
            {"id": 903, "image_id": img["id"], "category_id": 1, "bbox": [w + 3, 2, 5, 5], "area": 25.0, "iscrowd": 0},
        ]

    edit(path, add)
    with caplog.at_level(logging.WARNING):
        index = load_coco(path, tmp_path / "val2017")
    first = index.images[0]
    width = first.width
    # the crowd and the box entirely outside are not training targets; the cut one is clipped
    assert [width - 5, 2, width, 10] in first.boxes.tolist()
    assert [1, 1, 11, 11] not in first.boxes.tolist()
    assert all(b[0] < width for b in first.boxes.tolist())
    # evaluation keeps every annotation as written, with its own area and crowd flag
    assert [1, 1, 11, 11] in first.eval_boxes.tolist()
    assert first.eval_iscrowd.tolist()[-3:] == [1, 0, 0] and first.eval_area.tolist()[-3:] == [80.0, 40.0, 25.0]
    assert "1 boxes have no area once clipped" in caplog.text and "annotation id 903" in caplog.text


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["annotations"][0].pop("bbox"), "annotations[0] (id 1) has no 'bbox'"),
        (lambda d: d["annotations"][0].update(category_id=2), "category_id 2, which 'categories' does not list"),
        (lambda d: d["annotations"][0].update(image_id=999), "refers to image id 999"),
        (lambda d: d["images"].append(dict(d["images"][0])), "repeats image id 1"),
        (lambda d: d["images"][2].update(file_name="absent.png"), "images[2] (id 3) lists 'absent.png'"),
        (lambda d: d["categories"].append(dict(d["categories"][0])), "repeats category id 1"),
        (lambda d: d["images"][1].pop("height"), "images[1] has no 'height'"),
        (lambda d: d.pop("annotations"), "the file has no 'annotations'"),
        (lambda d: d["annotations"][1].update(bbox=[1, 2, 3]), "expected [x, y, width, height]"),
    ],
)
def test_malformed_json_names_the_entry(tmp_path, change, message):
    path = write_coco(tmp_path)
    edit(path, change)
    with pytest.raises(DataError, match=re.escape(f"{path}: ") + ".*" + re.escape(message)):
        load_coco(path, tmp_path / "val2017")


def test_invalid_json_and_missing_files(tmp_path):
    path = write_coco(tmp_path)
    path.write_text('{"images": [')
    with pytest.raises(DataError, match="not valid JSON"):
        load_coco(path, tmp_path / "val2017")
    with pytest.raises(FileNotFoundError, match="instances_train2017.json"):
        load_coco(tmp_path / "annotations" / "instances_train2017.json", tmp_path / "train2017")
    with pytest.raises(FileNotFoundError, match="python data_scripts/coco.py --out"):
        COCODataModule(root=str(tmp_path / "nowhere"))


def test_image_size_must_match_the_json(tmp_path):
    path = write_coco(tmp_path)
    edit(path, lambda d: d["images"][0].update(width=d["images"][0]["width"] + 1))
    dataset = CocoDetection(load_coco(path, tmp_path / "val2017"), detection_eval_transforms(MEAN, STD, 48))
    with pytest.raises(DataError, match="000000.png: the image is"):
        dataset[0]


def test_train_boxes_follow_the_flip_and_resize(tmp_path):
    path = write_coco(tmp_path)
    index = load_coco(path, tmp_path / "val2017")
    i = next(k for k, img in enumerate(index.images) if len(img.boxes))
    entry = index.images[i]
    transform = detection_train_transforms(
        MEAN, STD, scales=[96], max_size=None, crop_scales=[48], crop_size=(40, 48), hflip=1.0
    )
    # force the plain resize branch: the flip then the resize have a known result
    transform.transforms[1].transforms_ps = [1.0, 0.0]
    sample = CocoDetection(index, transform, with_eval_targets=False)[i]
    height, width = sample.image.shape[-2:]
    assert min(height, width) == 96
    x1, y1, x2, y2 = entry.boxes.T / np.array([entry.width, entry.height, entry.width, entry.height])[:, None]
    flipped = np.stack([(2 - x1 - x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], 1)  # cx mirrored, normalised
    got = sample.targets.boxes.numpy()
    mine, theirs = np.lexsort(got.T[::-1]), np.lexsort(flipped.T[::-1])
    np.testing.assert_allclose(got[mine], flipped[theirs], atol=1e-5)
    assert sample.targets.labels.numpy()[mine].tolist() == entry.labels[theirs].tolist()


def test_crop_branch_drawn_half_the_time():
    """DETR's RandomSelect(resize, resize-crop-resize) picks each branch with p = 0.5."""
    transform = detection_train_transforms(MEAN, STD, scales=[16], max_size=None, crop_scales=[40], crop_size=(10, 10))
    select = transform.transforms[1]
    assert select.p == 1.0 and select.transforms_ps == [0.5, 0.5]
    assert all(branch.p == 1.0 for branch in select.transforms)  # a drawn branch runs whole
    transform.set_random_seed(0)
    image = np.zeros((20, 30, 3), dtype=np.uint8)
    # the plain resize keeps the 2:3 shape (16 x 24); the crop branch makes a 10 x 10 crop square
    shapes = [tuple(transform(image=image, bboxes=np.zeros((0, 4)), labels=[])["image"].shape[1:]) for _ in range(400)]
    assert set(shapes) == {(16, 24), (16, 16)}
    assert 165 <= shapes.count((16, 16)) <= 235  # 200 expected (sd 10); 1/3 of the time gives 133 (sd 9)


def test_square_resize_is_rf_detrs(tmp_path):
    """`square=True`: RF-DETR's SquareResize, an S x S image from any shape (S drawn from the
    scales, in both branches) whose boxes scale with each side on its own; evaluation at
    `short_side` x `short_side`."""
    path = write_coco(tmp_path)
    index = load_coco(path, tmp_path / "val2017")
    i = next(k for k, img in enumerate(index.images) if len(img.boxes))
    entry = index.images[i]
    transform = detection_train_transforms(
        MEAN, STD, scales=[32, 64], max_size=None, crop_scales=[48], crop_size=(40, 48), hflip=0.0, square=True
    )
    transform.set_random_seed(0)
    image = np.zeros((20, 30, 3), dtype=np.uint8)
    shapes = {tuple(transform(image=image, bboxes=np.zeros((0, 4)), labels=[])["image"].shape[1:]) for _ in range(40)}
    assert shapes == {(32, 32), (64, 64)}  # both sides, both branches
    sample = CocoDetection(index, detection_eval_transforms(MEAN, STD, 56, None, square=True))[i]
    assert tuple(sample.image.shape[1:]) == (56, 56)
    x1, y1, x2, y2 = entry.boxes.T / np.array([entry.width, entry.height, entry.width, entry.height])[:, None]
    expected = np.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], 1)  # normalised: unchanged by any resize
    got = sample.targets.boxes.numpy()
    np.testing.assert_allclose(got[np.lexsort(got.T[::-1])], expected[np.lexsort(expected.T[::-1])], atol=1e-5)


def test_synthetic_data_takes_the_square_resize(tmp_path):
    """The synthetic detection data (whose images are not square) passes `square_resize` on:
    training images are S x S for S in its scales, a batch holds no other sizes, evaluation
    is img_size x img_size; without it, shortest-side resizes keep each image's shape."""
    dm = SyntheticDetectionDataModule(
        root=str(tmp_path),
        img_size=32,
        train_size=12,
        val_size=3,
        square_resize=True,
        loader=LoaderConfig(batch_size=12),
    )
    dm.prepare_data()
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert set(batch.image_sizes.sizes) <= {(16, 16), (24, 24), (32, 32)}
    assert {tuple(s) for s in next(iter(dm.val_dataloader())).image_sizes.sizes} == {(32, 32)}
    kept = SyntheticDetectionDataModule(root=str(tmp_path), img_size=32, train_size=12, val_size=3)
    kept.setup("validate")
    assert {tuple(s) for s in next(iter(kept.val_dataloader())).image_sizes.sizes} != {(32, 32)}


def test_detr_resize_rule():
    assert short_side_size(480, 640, 800, 1333) == (800, 1066)
    assert short_side_size(400, 1200, 800, 1333) == (444, 1332)  # the long side bounds the short one (DETR rounds down)
    assert short_side_size(640, 480, 800, None) == (1066, 800)


def test_datamodule_batches(tmp_path):
    for split in ("train2017", "val2017"):
        write_coco(tmp_path, split, num_images=5)
    dm = COCODataModule(
        root=str(tmp_path),
        img_size=48,
        scales=[48, 56],
        max_size=None,
        crop_scales=[48],
        crop_size=(32, 48),
        eval_short_side=48,
        loader=LoaderConfig(batch_size=2, num_workers=0),
    )
    assert dm.num_classes == 3 and dm.class_names == ["circle", "square", "triangle"]
    dm.setup("fit")
    batch = pad_collate([dm.val_dataset[i] for i in range(3)])
    assert batch.image.shape[0] == 3 and len(batch.targets) == 3 and len(batch.eval_targets) == 3
    for (h, w), t in zip(batch.image_sizes.sizes, batch.targets, strict=True):
        assert batch.image_sizes.padded == batch.image.shape[-2:]
        assert torch.all((t.boxes >= 0) & (t.boxes <= 1))
        assert min(h, w) == 48
    train = dm.train_dataset[0]
    assert train.eval_targets is None


def test_png_written_matches_json(tmp_path):
    path = write_coco(tmp_path, num_images=3)
    data = json.loads(path.read_text())
    for img in data["images"]:
        with Image.open(tmp_path / "val2017" / img["file_name"]) as im:
            assert im.size == (img["width"], img["height"])
