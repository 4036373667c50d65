"""Offline synthetic pose data: stick figures with 13 named keypoints, written to disk as a
COCO keypoint dataset (PNG images + `person_keypoints_<split>.json`).

For the keypoint demo and the tests, where no dataset can be downloaded: the data goes
through the same files and checks as COCO's person keypoints. An image holds 0 to 3 figures
(`FIGURE`'s schema) of random pose, size and colour on a textured background. Figures face
the viewer and stand upright (the torso leans at most 25 degrees), so a figure's left side
is on the image's right, as in COCO: left and right are told apart by the torso's corners,
and a horizontal flip with `FIGURE.flip_index` gives a figure of the same kind.

The cases keypoint training has to handle all occur:

- occluded keypoints (v = 1): a later figure, or a textured rectangle drawn over the scene,
  covers the keypoint's pixel;
- figures across the border: keypoints outside the image are not labelled (v = 0,
  x = y = 0), and the box is that of the pixels inside;
- visible keypoints (v = 2) lie inside the image on a pixel of their own figure.

Coordinates are COCO's continuous ones: pixel (row r, column c) covers [c, c + 1) x [r, r + 1),
so a keypoint (x, y) is on pixel (floor(y), floor(x)) and a box [x1, y1, x2, y2] holds the
columns x1 .. x2 - 1. Every sample is a pure function of (seed, split, index).
"""

from __future__ import annotations

import colorsys
import json
from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image, ImageDraw

from vitdense.data.base import LoaderConfig, Triple
from vitdense.data.coco import COCODataModule
from vitdense.data.synthetic.classification import WrittenOnFirstUse, textured_background
from vitdense.data.synthetic.detection import SYNTHETIC_DET_LOADER, generated_coco
from vitdense.types.keypoints import KeypointSchema

# Sigmas. OKS = exp(-d^2 / (2 area (2 sigma)^2)) scores an error of d pixels against the
# square root of the object's area. A figure's area (its pixels: filled torso, disc head,
# limbs 6% of its stature thick) is about 0.2 x stature^2 (measured), roughly a standing
# COCO person's share of its height squared (a box 0.4 as wide as tall, half filled), so
# sqrt(area) ~ 0.45 x stature and a keypoint scores OKS 0.5 at an error of about
# sigma x stature: with sigmas of COCO's body joints (0.062-0.107, mean 0.083), OKS is about
# as strict on a figure as on a person of its size: 3-4 pixels for the ~40-pixel figures of
# a 96-pixel image, about a quarter of a 16-pixel patch. The values follow how sharply the
# drawing defines each point (the annotations hold no noise): the head, centre of a disc,
# the sharpest (COCO's nose's 0.026 would ask for sub-pixel precision here); the torso's
# corners next; hands and feet, the ends of the limbs that move most; elbows and knees the
# widest, since on a straight limb only the body's proportions place them.
#: the stick figures' 13 keypoints: names, skeleton (0-based), left <-> right, OKS sigmas
FIGURE = KeypointSchema(
    names=(
        "head", "left_shoulder", "right_shoulder", "left_elbow", "right_elbow", "left_hand", "right_hand",
        "left_hip", "right_hip", "left_knee", "right_knee", "left_foot", "right_foot",
    ),
    skeleton=(
        (0, 1), (0, 2), (1, 2), (1, 3), (3, 5), (2, 4), (4, 6), (1, 7), (2, 8), (7, 8), (7, 9), (9, 11), (8, 10),
        (10, 12),
    ),
    flip_index=(0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11),
    sigmas=(0.07, 0.08, 0.08, 0.10, 0.10, 0.09, 0.09, 0.08, 0.08, 0.10, 0.10, 0.09, 0.09),
)  # fmt: skip
HEAD, L_SHOULDER, R_SHOULDER, L_ELBOW, R_ELBOW, L_HAND, R_HAND, L_HIP, R_HIP, L_KNEE, R_KNEE, L_FOOT, R_FOOT = range(13)
#: the figures' COCO category
CATEGORY_ID, CATEGORY_NAME = 1, "figure"
#: a figure shows at least this many pixels inside the image, and at least this many keypoints
MIN_PIXELS, MIN_KEYPOINTS_INSIDE = 24, 4
#: a later figure or an occluder may hide at most this share of an earlier figure's pixels
MAX_HIDDEN = 0.5

# Body proportions in units of the figure's stature (head top to feet, standing straight):
# a stick figure's big head, a torso a third of the height, legs a little under half.
HEAD_RADIUS, NECK, TORSO = 0.09, 0.06, 0.30
SHOULDER_HALF, HIP_HALF = 0.10, 0.07
UPPER_ARM, FOREARM, THIGH, SHIN = 0.17, 0.16, 0.23, 0.22
#: limb thickness as a share of the stature (at least 2 pixels, so a limb is never broken)
LIMB_WIDTH = 0.06


class PoseFigure(NamedTuple):
    """One figure of a scene, as annotated.

    Attributes:
        box: [4] float64 (x1, y1, x2, y2) pixels, the tight box of `mask`.
        keypoints: [K, 3] float64 (x, y, v) in `FIGURE`'s order, COCO's convention.
        area: the number of pixels of `mask`.
        mask: [H, W] bool, the figure's visible pixels (inside the image, not covered).
        drawn: [H, W] bool, all its pixels inside the image, covered or not.
    """

    box: np.ndarray
    keypoints: np.ndarray
    area: int
    mask: np.ndarray
    drawn: np.ndarray


class PoseScene(NamedTuple):
    """One generated image and what it shows.

    Attributes:
        image: [H, W, 3] uint8.
        figures: the annotated figures, in drawing order (a later one covers an earlier one).
        occluder: [H, W] bool, the pixels covered by rectangles drawn over the figures.
    """

    image: np.ndarray
    figures: list[PoseFigure]
    occluder: np.ndarray


def random_pose(rng: np.random.Generator) -> np.ndarray:
    """[K, 2] keypoints (x, y) of a random upright pose, in units of stature, y down, the
    middle of the hips at the origin.

    Joint angles are drawn within limits a body reaches in a front view: arms from hanging
    down to raised above the head, elbows bent either way, legs from slightly crossed to a
    wide stride, knees bent. Left and right limbs draw from mirrored ranges, so the
    distribution is symmetric under a horizontal flip with `FIGURE.flip_index`.
    """
    lean = np.deg2rad(rng.uniform(-25, 25))
    up = np.array([np.sin(lean), -np.cos(lean)])
    across = np.array([np.cos(lean), np.sin(lean)])  # towards the figure's left: the image's right
    points = np.zeros((13, 2))
    shoulders = TORSO * up
    nod = np.deg2rad(rng.uniform(-15, 15))
    neck = np.cos(nod) * up + np.sin(nod) * across
    points[HEAD] = shoulders + (NECK + HEAD_RADIUS) * neck

    def limb(side: float, angle: float) -> np.ndarray:
        # `angle` degrees from the torso's down direction, turned outwards on the limb's side
        a = np.deg2rad(angle)
        return np.cos(a) * -up + np.sin(a) * side * across

    for side, (shoulder, elbow, hand, hip, knee, foot) in (
        (1.0, (L_SHOULDER, L_ELBOW, L_HAND, L_HIP, L_KNEE, L_FOOT)),
        (-1.0, (R_SHOULDER, R_ELBOW, R_HAND, R_HIP, R_KNEE, R_FOOT)),
    ):
        points[shoulder] = shoulders + side * SHOULDER_HALF * across
        points[hip] = side * HIP_HALF * across
        arm = rng.uniform(-20, 170)
        points[elbow] = points[shoulder] + UPPER_ARM * limb(side, arm)
        points[hand] = points[elbow] + FOREARM * limb(side, arm + rng.uniform(-30, 140))
        leg = rng.uniform(-15, 55)
        points[knee] = points[hip] + THIGH * limb(side, leg)
        points[foot] = points[knee] + SHIN * limb(side, leg + rng.uniform(-60, 30))
    return points


def draw_figure(points: np.ndarray, stature: float, height: int, width: int) -> np.ndarray:
    """[H, W] bool pixels of a figure with keypoints `points` [K, 2] (pixels, COCO's
    continuous coordinates): a filled torso, thick limbs with round joints, a neck and a
    disc of a head; the parts outside the image are clipped."""
    canvas = Image.new("L", (width, height))
    draw = ImageDraw.Draw(canvas)
    xy = [tuple(p) for p in points - 0.5]  # PIL's integer coordinates are pixel centres
    limb = max(2.0, LIMB_WIDTH * stature)
    torso = [xy[L_SHOULDER], xy[R_SHOULDER], xy[R_HIP], xy[L_HIP]]
    draw.polygon(torso, fill=1)
    draw.line([*torso, torso[0]], fill=1, width=round(limb))
    neck = tuple((points[L_SHOULDER] + points[R_SHOULDER]) / 2 - 0.5)
    for a, b in [(neck, xy[HEAD])] + [(xy[i], xy[j]) for i, j in FIGURE.skeleton if HEAD not in (i, j)]:
        draw.line([a, b], fill=1, width=round(limb))
    r = limb / 2
    for x, y in xy[1:]:
        draw.ellipse([x - r, y - r, x + r, y + r], fill=1)
    r = HEAD_RADIUS * stature
    x, y = xy[HEAD]
    draw.ellipse([x - r, y - r, x + r, y + r], fill=1)
    mask = np.asarray(canvas, dtype=bool).copy()
    # a joint's own pixel is the figure's even where a 2-pixel disc rasterises beside it, so
    # that "visible" (v = 2) always means "on the figure"
    cols, rows = np.floor(points).astype(int).T
    inside = (cols >= 0) & (cols < width) & (rows >= 0) & (rows < height)
    mask[rows[inside], cols[inside]] = True
    return mask


def _colour(rng: np.random.Generator) -> np.ndarray:
    """A saturated bright colour in [0, 1]: figures stand out from the dark backgrounds and
    from one another."""
    return np.array(colorsys.hsv_to_rgb(rng.uniform(), rng.uniform(0.45, 1.0), rng.uniform(0.8, 1.0)))


def _hides_too_much(drawn: list[np.ndarray], cover: np.ndarray, occluder: np.ndarray) -> bool:
    """Whether `cover`, drawn over every figure of `drawn` (and under nothing but
    `occluder`), would leave one with too few visible pixels."""
    above = occluder | cover
    for mask in reversed(drawn):
        own = mask.sum()
        visible = (mask & ~above).sum()
        if visible < max(MIN_PIXELS, (1 - MAX_HIDDEN) * own):
            return True
        above = above | mask
    return False


def pose_scene(height: int, width: int, rng: np.random.Generator, max_figures: int = 3) -> PoseScene:
    """One image of 0 to `max_figures` stick figures (rarely none).

    A figure's stature is 30-70% of the image's shorter side and its extent's centre lies
    anywhere in the middle 70% of the image, so that a good share of figures cross the
    border. Figures may cross one another (a later one covers an earlier one), and about a
    third of the images get a textured rectangle over the figures. A placement that would
    show fewer than `MIN_PIXELS` pixels or `MIN_KEYPOINTS_INSIDE` keypoints inside the image,
    or hide more than `MAX_HIDDEN` of an earlier figure, is drawn again (at most 20 times).
    """
    side = min(height, width)
    image = textured_background(max(height, width), rng)[:height, :width]
    drawn: list[np.ndarray] = []
    keypoints: list[np.ndarray] = []
    occluder = np.zeros((height, width), dtype=bool)
    count = int(rng.choice(max_figures + 1, p=[0.04] + [0.96 / max_figures] * max_figures))
    for _ in range(count):
        for _try in range(20):
            stature = rng.uniform(0.3, 0.7) * side
            points = random_pose(rng) * stature
            low = points.min(0) - HEAD_RADIUS * stature
            high = points.max(0) + HEAD_RADIUS * stature
            centre = rng.uniform(0.15, 0.85, 2) * (width, height)
            # rounded as written to the JSON, so that visibility is judged where the file says
            points = np.round(points + centre - (low + high) / 2, 2)
            inside = (points >= 0).all(1) & (points < (width, height)).all(1)
            if inside.sum() < MIN_KEYPOINTS_INSIDE:
                continue
            mask = draw_figure(points, stature, height, width)
            if mask.sum() < MIN_PIXELS or _hides_too_much(drawn, mask, occluder):
                continue
            drawn.append(mask)
            keypoints.append(points)
            image[mask] = _colour(rng)
            break
    if drawn and rng.uniform() < 0.35:
        for _try in range(10):
            h, w = (rng.uniform(0.12, 0.35, 2) * side).astype(int) + 1
            y0, x0 = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
            block = np.zeros_like(occluder)
            block[y0 : y0 + h, x0 : x0 + w] = True
            if not _hides_too_much(drawn, block, occluder):
                occluder = block
                # textured and duller than the figures: an object in front, not a figure
                texture = rng.uniform(0.15, 0.55, 3) + rng.normal(0, 0.06, (h, w, 1))
                image[y0 : y0 + h, x0 : x0 + w] = np.clip(texture, 0, 1)
                break
    figures = []
    above = occluder.copy()
    for mask, points in zip(reversed(drawn), reversed(keypoints), strict=True):
        visible = mask & ~above
        above |= mask
        cols, rows = np.floor(points).astype(int).T
        inside = (cols >= 0) & (cols < width) & (rows >= 0) & (rows < height)
        v = np.zeros(len(points))
        v[inside] = np.where(visible[rows[inside], cols[inside]], 2, 1)
        triplets = np.concatenate([np.where(inside[:, None], points, 0.0), v[:, None]], axis=1)
        ys, xs = np.nonzero(visible)
        box = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=np.float64)
        figures.append(PoseFigure(box, triplets, int(visible.sum()), visible, mask))
    return PoseScene(np.round(image * 255).astype(np.uint8), figures[::-1], occluder)


def pose_category() -> dict:
    """The figures' COCO category, with its keypoint names and skeleton (1-based, as COCO)."""
    return {
        "id": CATEGORY_ID,
        "name": CATEGORY_NAME,
        "supercategory": CATEGORY_NAME,
        "keypoints": list(FIGURE.names),
        "skeleton": [[a + 1, b + 1] for a, b in FIGURE.skeleton],
    }


def write_synthetic_pose_coco(root: str | Path, split: str, num_images: int, img_size: int = 96, seed: int = 0) -> Path:
    """Write `<root>/<split>/NNNNNN.png` and `<root>/annotations/person_keypoints_<split>.json`.

    Image sides are drawn in [0.75, 1.25] x `img_size`; every sample is a pure function of
    (seed, split, index). Each figure's annotation holds COCO's `keypoints` (K flattened
    (x, y, v) triplets), `num_keypoints` (how many have v > 0), `bbox` (x, y, w, h of its
    visible pixels), `area` (their count) and `iscrowd` 0. Returns the JSON path.
    """
    root = Path(root)
    image_dir = root / split
    image_dir.mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    low, high = round(0.75 * img_size), round(1.25 * img_size)
    for i in range(num_images):
        rng = np.random.default_rng([seed, sum(map(ord, split)), i])
        height, width = (int(v) for v in rng.integers(low, high + 1, 2))
        scene = pose_scene(height, width, rng)
        file_name = f"{i:06d}.png"
        Image.fromarray(scene.image).save(image_dir / file_name)
        images.append({"id": i + 1, "file_name": file_name, "height": height, "width": width})
        for figure in scene.figures:
            x1, y1, x2, y2 = (int(v) for v in figure.box)
            kp = figure.keypoints
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": i + 1,
                    "category_id": CATEGORY_ID,
                    "keypoints": [round(float(v), 2) if j % 3 < 2 else int(v) for j, v in enumerate(kp.ravel())],
                    "num_keypoints": int((kp[:, 2] > 0).sum()),
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": figure.area,
                    "iscrowd": 0,
                }
            )
    path = root / "annotations" / f"person_keypoints_{split}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"images": images, "annotations": annotations, "categories": [pose_category()]}))
    tmp.replace(path)  # the JSON appears last and whole: its presence means the split is complete
    return path


class SyntheticPoseDataModule(WrittenOnFirstUse, COCODataModule):
    """The stick figures as a COCO keypoint dataset, generated on first use under `root` and
    read back like COCO's person keypoints (`COCODataModule`: the JSON's checks, DETR's
    augmentation with keypoints flipped by `FIGURE.flip_index`); the figures' sigmas
    (`FIGURE.sigmas`) score keypoint AP.

    Args:
        root: where to write the dataset.
        img_size: the backbone's native size, and the images' typical side (sides in
            [0.75, 1.25] x img_size); evaluation resizes the shortest side to it.
        train_size, val_size: images per split.
        seed: base seed of the generator.
        scales: training shortest sides (None: img_size - 16 to img_size, step 8).
        max_size: bound of the longest side (None: img_size).
        square_resize: RF-DETR's square resize instead (see `SyntheticDetectionDataModule`).
        loader, backbone, mean, std, predict_dir: see `ImageDataModule`.
    """

    kind = "pose"

    def __init__(
        self,
        *,
        root: str = "data/synthetic_pose",
        img_size: int = 96,
        train_size: int = 2000,
        val_size: int = 200,
        seed: int = 0,
        scales: list[int] | None = None,
        max_size: int | None = None,
        square_resize: bool = False,
        loader: LoaderConfig = SYNTHETIC_DET_LOADER,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        predict_dir: str | None = None,
    ) -> None:
        self.synthetic = {"img_size": img_size, "train_size": train_size, "val_size": val_size, "seed": seed}
        super().__init__(
            root=root,
            **generated_coco("person_keypoints", img_size, scales, max_size),
            keypoint_sigmas=list(FIGURE.sigmas or ()),  # (the JSON names the keypoints; COCO's format has no sigmas)
            square_resize=square_resize,
            loader=loader,
            backbone=backbone,
            mean=mean,
            std=std,
            predict_dir=predict_dir,
        )

    def read_categories(self) -> tuple[list[int], list[str]]:
        self.keypoint_schema = FIGURE
        return [CATEGORY_ID], [CATEGORY_NAME]

    def write_splits(self) -> None:
        s = self.synthetic
        for split, size in (("train", s["train_size"]), ("val", s["val_size"])):
            write_synthetic_pose_coco(self.root, split, size, s["img_size"], s["seed"])
