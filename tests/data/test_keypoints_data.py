"""Keypoint data: COCO keypoint JSON and YOLO-pose folders read into one `KeypointSchema` and
[n, K, 3] arrays, their bad inputs, and keypoints moved by DETR's augmentation (flip swaps,
crops cut), through the dataset and the collate."""

import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from vitdense.core.errors import DataError
from vitdense.data import COCODataModule, CocoDetection, LoaderConfig, YoloDetectionDataModule, load_coco, yolo_to_coco
from vitdense.data.keypoints import schema_from_names
from vitdense.data.transforms.detection import detection_eval_transforms, detection_train_transforms
from vitdense.types import COCO_PERSON, KeypointSchema

MEAN = STD = (0.5, 0.5, 0.5)
W, H = 40, 32
NAMES = ["nose", "left_eye", "right_eye"]
SCHEMA = KeypointSchema(tuple(NAMES), ((0, 1), (0, 2)), (0, 2, 1), None)
SMALL = dict(
    img_size=32,
    scales=[32],
    max_size=None,
    crop_scales=[32],
    crop_size=(16, 32),
    eval_short_side=32,
    loader=LoaderConfig(batch_size=3, num_workers=0),
)
#: image 1's objects (boxes x1, y1, x2, y2 and keypoints in pixels): two people and a ball
A_BOX, A_KPS = [4, 4, 20, 24], [[10, 6, 2], [8, 5, 1], [12, 5, 2]]
B_BOX, B_KPS = [30, 2, 38, 14], [[34, 4, 2], [32, 3, 2], [0, 0, 0]]
BALL_BOX = [22, 10, 28, 16]
NONE = [[0, 0, 0]] * 3


def ann(id_, image, category, box, kps=None, crowd=0):
    x1, y1, x2, y2 = box
    out = {"id": id_, "image_id": image, "category_id": category, "bbox": [x1, y1, x2 - x1, y2 - y1]}
    out.update(area=float((x2 - x1) * (y2 - y1)), iscrowd=crowd)
    if kps is not None:
        out.update(keypoints=sum(kps, []), num_keypoints=sum(v > 0 for _, _, v in kps))
    return out


def write_coco_keypoints(root: Path, split: str = "val") -> Path:
    """Three 40 x 32 images in COCO's layout: people (with a crowd) and a ball (a category
    without keypoints); one person without keypoints; one image without objects."""
    (root / split).mkdir(parents=True)
    (root / "annotations").mkdir(exist_ok=True)
    for i in (1, 2, 3):
        Image.new("RGB", (W, H), (40 * i, 90, 200)).save(root / split / f"{i}.png")
    data = {
        "images": [{"id": i, "file_name": f"{i}.png", "height": H, "width": W} for i in (1, 2, 3)],
        "annotations": [
            ann(1, 1, 1, A_BOX, A_KPS),
            ann(2, 1, 1, B_BOX, B_KPS),
            ann(3, 1, 2, BALL_BOX),
            ann(4, 1, 1, [0, 20, 10, 30], NONE, crowd=1),
            ann(5, 2, 1, [5, 5, 15, 15], NONE),
        ],
        "categories": [
            {"id": 1, "name": "person", "keypoints": NAMES, "skeleton": [[1, 2], [1, 3]]},
            {"id": 2, "name": "ball"},
        ],
    }
    path = root / "annotations" / f"person_keypoints_{split}.json"
    path.write_text(json.dumps(data))
    return path


def coco_module(root: Path, **kwargs) -> COCODataModule:
    files = dict(train_images="val", train_annotations="annotations/person_keypoints_val.json")
    files.update(val_images="val", val_annotations="annotations/person_keypoints_val.json")
    return COCODataModule(root=str(root), **files, **SMALL, **kwargs)


def test_coco_keypoint_json_reads_into_the_schema_and_arrays(tmp_path):
    index = load_coco(write_coco_keypoints(tmp_path), tmp_path / "val")
    assert index.keypoint_schema == SCHEMA
    first, second, third = index.images
    # training: the kept non-crowd objects, aligned with boxes; evaluation: every annotation
    assert first.boxes.tolist() == [A_BOX, B_BOX, BALL_BOX]
    np.testing.assert_array_equal(first.keypoints, [A_KPS, B_KPS, NONE])
    np.testing.assert_array_equal(first.eval_keypoints, [A_KPS, B_KPS, NONE, NONE])
    assert first.keypoints.dtype == np.float32 and first.eval_iscrowd.tolist() == [0, 0, 0, 1]
    np.testing.assert_array_equal(second.keypoints, [NONE])
    assert third.keypoints.shape == third.eval_keypoints.shape == (0, 3, 3)


def test_the_names_give_cocos_flips_and_sigmas():
    assert schema_from_names(COCO_PERSON.names, COCO_PERSON.skeleton) == COCO_PERSON
    other = schema_from_names(["left_a", "b", "right_a", "left_c"])
    assert other.flip_index == (2, 1, 0, 3) and other.sigmas is None


def test_plain_detection_json_has_no_keypoints(tmp_path):
    path = write_coco_keypoints(tmp_path)
    data = json.loads(path.read_text())
    for cat in data["categories"]:
        cat.pop("keypoints", None), cat.pop("skeleton", None)
    path.write_text(json.dumps(data))
    index = load_coco(path, tmp_path / "val")
    assert index.keypoint_schema is None and all(i.keypoints is None and i.eval_keypoints is None for i in index.images)
    sample = CocoDetection(index, detection_eval_transforms(MEAN, STD, 32, None))[0]
    assert sample.targets.keypoints is None and sample.eval_targets.keypoints is None


def _set(i, **fields):
    return lambda d: d["annotations"][i].update(fields)


@pytest.mark.parametrize(
    "change, message",
    [
        (_set(0, keypoints=[1] * 8), "annotations[0] (id 1) has 8 keypoint values; expected 3 x 3 = 9"),
        (_set(0, keypoints=[10, 6, 2, 8, 5, 3, 12, 5, 2]), "annotations[0] (id 1) gives keypoint 1 (left_eye) visib"),
        (_set(0, num_keypoints=2), "annotations[0] (id 1) has num_keypoints 2 but 3 keypoints with v > 0"),
        (_set(3, keypoints=sum(A_KPS, [])), "annotations[3] (id 4) is a crowd region (iscrowd 1) with labelled"),
        (_set(3, num_keypoints=1), "annotations[3] (id 4) is a crowd region (iscrowd 1) with labelled"),
        (_set(1, keypoints=[float("nan")] + [0] * 8), "annotations[1] (id 2) has a non-finite keypoint value nan"),
        (_set(2, keypoints=sum(A_KPS, [])), "annotations[2] (id 3) has labelled keypoints but its category 2 lists"),
        (
            lambda d: d["categories"][1].update(keypoints=["a", "b"]),
            "categories[1] (id 2) lists keypoints ['a', 'b'] (skeleton []) but categories[0] (id 1) lists",
        ),
        (lambda d: d["categories"][0].update(skeleton=[[0, 1]]), "categories[0] (id 1) has skeleton [[0, 1]]"),
    ],
    ids=["length", "visibility", "num_keypoints", "crowd", "crowd_count", "nan", "unnamed", "two_schemas", "skeleton"],
)
def test_bad_coco_keypoints_name_the_file_and_annotation(tmp_path, change, message):
    path = write_coco_keypoints(tmp_path)
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    with pytest.raises(DataError, match=re.escape(f"{path}: {message}")):
        load_coco(path, tmp_path / "val")


def test_datamodule_schema_and_overrides(tmp_path):
    write_coco_keypoints(tmp_path)
    assert coco_module(tmp_path).keypoint_schema == SCHEMA  # known at construction, before setup
    dm = coco_module(tmp_path, keypoint_sigmas=[0.1, 0.2, 0.2], flip_index=[0, 1, 2])
    assert dm.keypoint_schema.sigmas == (0.1, 0.2, 0.2) and dm.keypoint_schema.flip_index == (0, 1, 2)
    dm.setup("validate")
    assert dm.val_dataset.index.keypoint_schema == dm.keypoint_schema
    with pytest.raises(DataError, match=r"keypoint_sigmas / flip_index .*: KeypointSchema: 2 sigmas for 3"):
        coco_module(tmp_path, keypoint_sigmas=[0.1, 0.2])
    with pytest.raises(DataError, match=r"flip_index .*not a pairing"):
        coco_module(tmp_path, flip_index=[1, 2, 0])


def test_flip_swaps_left_and_right_and_mirrors_as_the_boxes(tmp_path):
    index = load_coco(write_coco_keypoints(tmp_path), tmp_path / "val")
    transform = detection_train_transforms(MEAN, STD, **_sizes(SMALL), hflip=1.0, keypoints=SCHEMA)
    transform.transforms[1].transforms_ps = [1.0, 0.0]  # the plain resize (to the same size): a flip alone
    sample = CocoDetection(index, transform, with_eval_targets=True)[0]
    assert tuple(sample.image.shape[1:]) == (H, W)
    # x -> W - x as the boxes (A's box [4, 20] becomes [20, 36]); left_eye and right_eye trade places
    expected = np.array([[[30, 6, 2], [28, 5, 2], [32, 5, 1]], [[6, 4, 2], [0, 0, 0], [8, 3, 2]], NONE], np.float32)
    expected[..., :2] /= [W, H]
    torch.testing.assert_close(sample.targets.keypoints, torch.from_numpy(expected), rtol=0, atol=1e-6)
    torch.testing.assert_close(sample.targets.boxes[0], torch.tensor([28 / W, 14 / H, 16 / W, 20 / H]))
    # evaluation keeps the annotation as it is, in the original image's pixels
    assert sample.eval_targets.keypoints.tolist() == [A_KPS, B_KPS, NONE, NONE]


def test_crop_marks_points_outside_and_drops_the_keypoints_of_dropped_boxes(tmp_path):
    index = load_coco(write_coco_keypoints(tmp_path), tmp_path / "val")
    sizes = dict(_sizes(SMALL), scales=[16])
    transform = detection_train_transforms(MEAN, STD, **sizes, hflip=0.0, keypoints=SCHEMA)
    branch = transform.transforms[1]
    branch.transforms_ps = [0.0, 1.0]  # resize (unchanged), crop, resize to short side 16 (unchanged)
    crop = branch.transforms[1].transforms[1]
    crop.get_params_dependent_on_data = lambda params, data: {"crop_coords": (9, 0, 29, 16)}
    sample = CocoDetection(index, transform, with_eval_targets=False)[0]
    assert tuple(sample.image.shape[1:]) == (16, 20)
    # B (x >= 30) and its keypoints are gone; A keeps its box, its left eye (x = 8) is cut out
    assert sample.targets.labels.tolist() == [0, 1]
    expected = np.array([[[1, 6, 2], [0, 0, 0], [3, 5, 2]], NONE], np.float32)
    expected[..., :2] /= [20, 16]
    torch.testing.assert_close(sample.targets.keypoints, torch.from_numpy(expected), rtol=0, atol=1e-6)


def test_batches_carry_keypoints(tmp_path):
    write_coco_keypoints(tmp_path)
    dm = coco_module(tmp_path)
    dm.setup("validate")
    batch = next(iter(dm.val_dataloader()))
    assert [t.keypoints.shape for t in batch.targets] == [(3, 3, 3), (1, 3, 3), (0, 3, 3)]
    assert [t.keypoints.shape[0] for t in batch.eval_targets] == [4, 1, 0]
    with pytest.raises(DataError, match="does not move them; build it with keypoints=index.keypoint_schema"):
        CocoDetection(dm.index("val"), detection_eval_transforms(MEAN, STD, 32, None))[0]


def _sizes(small):
    return {k: small[k] for k in ("scales", "max_size", "crop_scales", "crop_size")}


# ---- YOLO-pose ----

POSE_YAML = {"kpt_shape": [3, 3], "flip_idx": [0, 2, 1], "kpt_names": {0: NAMES, 1: NAMES}}


def yolo_line(cls, box, kps, dim=3):
    x1, y1, x2, y2 = box
    values = [(x1 + x2) / 2 / W, (y1 + y2) / 2 / H, (x2 - x1) / W, (y2 - y1) / H]
    for x, y, v in kps:
        values += [x / W, y / H, v][:dim]
    return " ".join([str(cls)] + [repr(float(v)) for v in values])


def write_yolo_pose(root: Path, labels: dict[str, str | None] | None = None, **yaml_entries) -> Path:
    """The COCO JSON's images in YOLO-pose layout (classes person, ball; the crowd left out:
    YOLO has none); `labels` replaces the label files' text."""
    (root / "images" / "val").mkdir(parents=True)
    (root / "labels" / "val").mkdir(parents=True)
    if labels is None:
        first = [yolo_line(0, A_BOX, A_KPS), yolo_line(0, B_BOX, B_KPS), yolo_line(1, BALL_BOX, NONE)]
        labels = {"1": "\n".join(first), "2": yolo_line(0, [5, 5, 15, 15], NONE), "3": None}
    for name, text in labels.items():
        Image.new("RGB", (W, H), (90, 20, 200)).save(root / "images" / "val" / f"{name}.png")
        if text is not None:
            (root / "labels" / "val" / f"{name}.txt").write_text(text)
    data = {"val": "images/val", "names": ["person", "ball"], "skeleton": [[0, 1], [0, 2]], **POSE_YAML}
    data.update(yaml_entries)
    (root / "data.yaml").write_text(yaml.safe_dump({k: v for k, v in data.items() if v is not None}))
    return root


def test_yolo_pose_reads_as_the_coco_json_it_writes(tmp_path):
    root = write_yolo_pose(tmp_path / "yolo")
    dm = YoloDetectionDataModule(root=str(root), **SMALL)
    assert dm.keypoint_schema == SCHEMA and dm.hflip == 0.5
    index = dm.index("val")
    np.testing.assert_allclose(index.images[0].keypoints, [A_KPS, B_KPS, NONE], rtol=0, atol=1e-5)
    np.testing.assert_array_equal(index.images[1].keypoints, [NONE])
    assert index.images[2].keypoints.shape == (0, 3, 3)
    written = tmp_path / "val.json"
    written.write_text(json.dumps(yolo_to_coco(root, "val")))
    coco = json.loads(written.read_text())["categories"]
    assert [(c["keypoints"], c["skeleton"]) for c in coco] == [(NAMES, [[1, 2], [1, 3]])] * 2
    again = load_coco(written, root / "images" / "val")
    assert again.keypoint_schema == index.keypoint_schema  # (the flips: from the names, as flip_idx)
    for mine, theirs in zip(index.images, again.images, strict=True):
        for name in ("boxes", "labels", "keypoints", "eval_boxes", "eval_keypoints", "eval_area"):
            np.testing.assert_array_equal(getattr(mine, name), getattr(theirs, name))


def test_yolo_pose_two_values_per_keypoint_and_no_flip_idx(tmp_path, caplog):
    # Ultralytics' rule for [K, 2]: a negative x or y is not labelled, any other point is
    line = yolo_line(0, A_BOX, [[10, 6, 0], [8, 5, 0], [12, 5, 0]], dim=2).split()
    line[7] = "-0.005"  # left_eye's x
    root = write_yolo_pose(tmp_path, {"x": " ".join(line)}, kpt_shape=[3, 2], flip_idx=None, kpt_names=None)
    with caplog.at_level(logging.WARNING, logger="vitdense.data.yolo"):
        dm = YoloDetectionDataModule(root=str(root), **SMALL)
    assert dm.keypoint_schema == KeypointSchema(("0", "1", "2"), ((0, 1), (0, 2)))
    assert dm.hflip == 0.0 and "no flip_idx, so training does not flip" in caplog.text
    np.testing.assert_allclose(dm.index("val").images[0].keypoints, [[[10, 6, 2], [0, 0, 0], [12, 5, 2]]], atol=1e-5)


@pytest.mark.parametrize(
    "text, message",
    [
        (yolo_line(0, A_BOX, A_KPS)[:-4], "x.txt:1: 13 fields; expected 14 in a keypoint dataset"),
        (yolo_line(0, A_BOX, NONE) + "\n" + yolo_line(0, A_BOX, A_KPS)[:-1] + "3", "x.txt:2: keypoint 2 has visib"),
        (yolo_line(0, A_BOX, [[50, 6, 2]] * 3), "x.txt:1: keypoint coordinates reach 0.1875..1.25, outside [0, 1]"),
        (
            yolo_line(0, A_BOX, NONE).replace(" 0.0", " nan", 1),
            "x.txt:1: '0 0.3 0.4375 0.4 0.625 nan 0.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0' has a non-finite value",
        ),
    ],
    ids=["fields", "visibility", "outside", "nan"],
)
def test_bad_yolo_pose_lines_name_the_file_and_line(tmp_path, text, message):
    root = write_yolo_pose(tmp_path, {"x": text})
    with pytest.raises(DataError, match=re.escape(f"{root / 'labels' / 'val' / message}")):
        yolo_to_coco(root, "val")


@pytest.mark.parametrize(
    "entries, message",
    [
        ({"kpt_shape": [3, 4]}, "kpt_shape is [3, 4]; expected [K, 3]"),
        ({"kpt_shape": 3}, "kpt_shape is 3; expected [K, 3]"),
        ({"flip_idx": [0, 2]}, "flip_idx [0, 2] is not a pairing of the 3 keypoints"),
        ({"flip_idx": [1, 2, 0]}, "flip_idx [1, 2, 0] is not a pairing"),
        ({"kpt_names": {0: NAMES, 1: ["a", "b", "c"]}}, "kpt_names gives different keypoint names"),
    ],
    ids=["dim", "not_a_list", "flip_length", "flip_not_pairs", "names_differ"],
)
def test_bad_yolo_pose_yaml(tmp_path, entries, message):
    root = write_yolo_pose(tmp_path, **entries)
    with pytest.raises(DataError, match=re.escape(f"{root / 'data.yaml'}: {message}")):
        yolo_to_coco(root, "val")
