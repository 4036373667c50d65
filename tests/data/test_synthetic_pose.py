"""The generated pose set: stick figures whose keypoints, visibilities, boxes and areas agree
with the drawn pixels, written in COCO's keypoint format and scored by COCOeval itself."""

import contextlib
import io
import json

import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from vitdense.data.synthetic.keypoints import (
    FIGURE,
    L_HIP,
    L_SHOULDER,
    R_HIP,
    R_SHOULDER,
    pose_scene,
    random_pose,
    write_synthetic_pose_coco,
)


def scenes(count: int = 50, size: int = 80):
    rng = np.random.default_rng(0)
    shapes = rng.integers(round(0.75 * size), round(1.25 * size) + 1, (count, 2))
    return [pose_scene(int(h), int(w), np.random.default_rng([1, i])) for i, (h, w) in enumerate(shapes)]


def test_schema_pairs_left_with_right():
    assert FIGURE.num_keypoints == 13 and len(FIGURE.sigmas) == 13
    for i, j in enumerate(FIGURE.flip_index):
        mirrored = FIGURE.names[i].replace("left_", "@").replace("right_", "left_").replace("@", "right_")
        assert FIGURE.names[j] == mirrored
    # every keypoint is joined to the figure
    assert set(np.ravel(FIGURE.skeleton)) == set(range(13))


def test_figures_face_the_viewer_and_flip_into_figures():
    """A figure's left side is on the image's right (as COCO's people facing the camera),
    and a flipped figure, relabelled with flip_index, keeps that rule."""
    for i in range(50):
        points = random_pose(np.random.default_rng(i))
        flipped = (points * (-1, 1))[list(FIGURE.flip_index)]
        for p in (points, flipped):
            assert p[L_SHOULDER, 0] > p[R_SHOULDER, 0] and p[L_HIP, 0] > p[R_HIP, 0]


def test_visibility_follows_the_pixels():
    made = scenes()
    counts = np.zeros(3, dtype=int)
    for image, figures, occluder in made:
        height, width = image.shape[:2]
        assert len(figures) <= 3
        for k, figure in enumerate(figures):
            # box and area are those of the visible pixels, which wear one flat colour
            ys, xs = np.nonzero(figure.mask)
            assert figure.area == len(ys) > 0
            np.testing.assert_array_equal(figure.box, [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])
            assert len(np.unique(image[figure.mask], axis=0)) == 1
            assert not (figure.mask & ~figure.drawn).any()
            others = occluder.copy()
            for other in figures[k + 1 :]:
                others |= other.drawn  # only what is drawn later covers a figure
            x, y, v = figure.keypoints.T
            counts += np.bincount(v.astype(int), minlength=3)
            inside = (x >= 0) & (x < width) & (y >= 0) & (y < height)
            rows, cols = np.floor(y).astype(int), np.floor(x).astype(int)
            for i in np.flatnonzero(v == 2):
                assert inside[i] and figure.mask[rows[i], cols[i]]
            for i in np.flatnonzero(v == 1):
                assert inside[i] and figure.drawn[rows[i], cols[i]] and not figure.mask[rows[i], cols[i]]
                assert others[rows[i], cols[i]]
            assert (x[v == 0] == 0).all() and (y[v == 0] == 0).all()
            if (v == 0).any():
                # a keypoint outside: the figure, drawn in one piece, crosses the border
                edges = figure.drawn[[0, -1]].any() or figure.drawn[:, [0, -1]].any()
                assert edges and (v > 0).any()
    # every case occurs, the visible one most
    assert counts[0] > 0 and counts[1] > 0 and counts[2] > 5 * (counts[0] + counts[1])
    assert any(not figures for _, figures, _ in scenes(60, 48))
    assert any(occluder.any() for _, _, occluder in made)


def test_written_as_coco_keypoints_and_scored_perfect_by_cocoeval(tmp_path):
    path = write_synthetic_pose_coco(tmp_path, "val", 40, img_size=64, seed=3)
    assert path == tmp_path / "annotations" / "person_keypoints_val.json"
    assert len(list((tmp_path / "val").glob("*.png"))) == 40 and not list(path.parent.glob("*.tmp"))
    data = json.loads(path.read_text())
    (category,) = data["categories"]
    assert category["keypoints"] == list(FIGURE.names)
    assert category["skeleton"] == [[a + 1, b + 1] for a, b in FIGURE.skeleton]  # 1-based, as COCO
    for ann in data["annotations"]:
        v = ann["keypoints"][2::3]
        assert len(ann["keypoints"]) == 39 and ann["num_keypoints"] == sum(x > 0 for x in v)
        assert ann["iscrowd"] == 0 and ann["area"] <= ann["bbox"][2] * ann["bbox"][3]
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(path))
        results = [
            {"image_id": a["image_id"], "category_id": a["category_id"], "keypoints": a["keypoints"], "score": 1.0}
            for a in data["annotations"]
        ]

        def keypoint_ap(results):
            evaluation = COCOeval(gt, gt.loadRes(results), "keypoints")
            evaluation.params.kpt_oks_sigmas = np.array(FIGURE.sigmas)
            evaluation.evaluate()
            evaluation.accumulate()
            evaluation.summarize()
            return evaluation.stats[0]

        assert keypoint_ap(results) == pytest.approx(1.0)
        # two pixels off: the sigmas are strict enough to notice at this size
        shifted = [{**r, "keypoints": [c + 2 * (j % 3 < 2) for j, c in enumerate(r["keypoints"])]} for r in results]
        assert keypoint_ap(shifted) < 0.9


def test_samples_are_a_function_of_seed_split_and_index(tmp_path):
    def written(root, seed, split="train"):
        path = write_synthetic_pose_coco(root, split, 4, img_size=48, seed=seed)
        return path.read_bytes(), [(root / split / f"{i:06d}.png").read_bytes() for i in range(4)]

    a = written(tmp_path / "a", 0)
    assert written(tmp_path / "b", 0) == a
    assert written(tmp_path / "c", 1)[1] != a[1]
    assert written(tmp_path / "d", 0, "val")[1] != a[1]
