"""Object detection: the family's dataset (a COCO-format split), DataModule base and
predict sample.

Datasets yield `DetectedImages` with boxes as cxcywh in [0, 1] of the transformed image and,
for evaluation, the original annotations (`EvalTargets`); training uses DETR's augmentation
(`transforms/detection.py`). Where the files are and how the JSON is read is `coco.py`'s.
A keypoint dataset's samples also carry each object's keypoints, moved with the image.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import albumentations as A
import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision.ops import box_convert

from vitdense.core.errors import DataError
from vitdense.core.images import apply_orientation, read_image
from vitdense.core.preprocess import Preprocess
from vitdense.data.base import ImageDataModule, LoaderConfig, Triple, require_positive
from vitdense.data.transforms.detection import detection_eval_transforms, detection_train_transforms
from vitdense.types import BoxTargets, DetectedImages, EvalTargets

if TYPE_CHECKING:
    from vitdense.data.coco_json import CocoIndex
    from vitdense.types.keypoints import KeypointSchema


class CocoDetection(Dataset):
    """A COCO-format split as `DetectedImages`.

    With a keypoint index (`index.keypoint_schema`), `BoxTargets.keypoints` are [n, K, 3]
    with (x, y) in [0, 1] of the transformed image, (0, 0, 0) for a keypoint not labelled or
    moved out of the image by a crop, and `EvalTargets.keypoints` [m, K, 3] as annotated
    (pixels of the original image); else both are None.

    Args:
        index: the checked JSON (`load_coco`).
        transform: albumentations pipeline called as `transform(image=, bboxes=, labels=)`
            (`detection_train_transforms` / `detection_eval_transforms`), built with the
            index's `keypoint_schema` for a keypoint index.
        with_eval_targets: attach the original annotations (`EvalTargets`) for evaluation.
    """

    def __init__(
        self, index: CocoIndex, transform: Callable[..., dict[str, Any]], with_eval_targets: bool = True
    ) -> None:
        self.index = index
        self.transform = transform
        self.with_eval_targets = with_eval_targets

    def __len__(self) -> int:
        return len(self.index.images)

    @property
    def image_paths(self) -> list[Path]:
        return [self.index.image_dir / img.file_name for img in self.index.images]

    @property
    def image_ids(self) -> list[int]:
        """Each sample's `image_id` in the JSON (what COCO results name)."""
        return self.index.image_ids

    @property
    def category_ids(self) -> list[int]:
        """The JSON's category id of each class, in label order."""
        return self.index.category_ids

    def __getitem__(self, i: int) -> DetectedImages:
        entry = self.index.images[i]
        path = self.index.image_dir / entry.file_name
        # COCO's sizes and boxes are those of the pixels as stored (pycocotools and torchvision
        # ignore EXIF orientation); a dataset annotated on upright photos matches after turning
        pixels, code = read_image(path)
        upright = apply_orientation(pixels, code)
        image = pixels if pixels.shape[:2] == (entry.height, entry.width) else upright
        if image.shape[:2] != (entry.height, entry.width):
            raise DataError(
                f"{path}: the image is {image.shape[1]}x{image.shape[0]} (width x height) but "
                f"{self.index.annotation_file} says {entry.width}x{entry.height}; fix the JSON entry of image id {entry.id}"
            )
        points = {}
        if entry.keypoints is not None:
            if "keypoints" not in self.transform.processors:
                raise DataError(
                    f"{self.index.annotation_file} has keypoints but the dataset's transform does not move them; "
                    "build it with keypoints=index.keypoint_schema (detection_train_transforms, "
                    "detection_eval_transforms)"
                )
            points = {
                "objects": np.arange(len(entry.boxes)),
                "keypoints": entry.keypoints[..., :2].reshape(-1, 2),
                "visibility": entry.keypoints[..., 2].reshape(-1),
            }
        out = self.transform(image=image, bboxes=entry.boxes, labels=entry.labels, **points)
        img = out["image"]
        height, width = img.shape[-2:]
        corners = torch.as_tensor(np.asarray(out["bboxes"], dtype=np.float32).reshape(-1, 4))
        labels = torch.as_tensor(np.asarray(out["labels"]), dtype=torch.int64).reshape(-1)
        keep = (corners[:, 2] > corners[:, 0]) & (corners[:, 3] > corners[:, 1])
        corners, labels = corners[keep], labels[keep]
        scale = torch.tensor([width, height, width, height], dtype=torch.float32)
        boxes = box_convert(corners / scale, "xyxy", "cxcywh")
        keypoints = None
        if entry.keypoints is not None:
            objects = np.asarray(out["objects"], dtype=np.int64).reshape(-1)[keep.numpy()]
            keypoints = moved_keypoints(out, entry.keypoints.shape[1], objects, (int(height), int(width)))
        eval_targets = None
        if self.with_eval_targets:
            eval_targets = EvalTargets(
                torch.from_numpy(entry.eval_boxes),
                torch.from_numpy(entry.eval_labels),
                torch.from_numpy(entry.eval_iscrowd),
                torch.from_numpy(entry.eval_area),
                None if entry.eval_keypoints is None else torch.from_numpy(entry.eval_keypoints),
            )
        return DetectedImages(
            img,
            BoxTargets(boxes, labels, keypoints),
            i,
            image_sizes=(int(height), int(width)),
            orig_sizes=(entry.height, entry.width),
            eval_targets=eval_targets,
        )


def moved_keypoints(out: dict[str, Any], k: int, objects: np.ndarray, size: tuple[int, int]) -> torch.Tensor:
    """[len(objects), K, 3] float32 keypoints of the objects whose boxes survived the transform
    (`objects`: their indices among the n given), from its output `out` (keypoints [n * K, 2]
    pixels, visibility [n * K]), with (x, y) in [0, 1] of the (H, W) `size`: a keypoint that
    is not labelled, or that a crop left outside the image, is (0, 0, 0)."""
    height, width = size
    xy = np.asarray(out["keypoints"], dtype=np.float32).reshape(-1, k, 2)[objects]
    v = np.asarray(out["visibility"], dtype=np.float32).reshape(-1, k)[objects]
    # inclusive edges: a flip maps x = 0 to x = W, which must stay inside
    inside = (xy[..., 0] >= 0) & (xy[..., 0] <= width) & (xy[..., 1] >= 0) & (xy[..., 1] <= height)
    v = np.where(inside, v, 0.0)
    xy = np.where(v[..., None] > 0, xy / np.array([width, height], dtype=np.float32), 0.0)
    return torch.from_numpy(np.concatenate([xy, v[..., None]], -1).astype(np.float32))


class DetectionDataModule(ImageDataModule):
    """The base of detection DataModules: DETR's augmentation, the categories and the splits
    as `CocoDetection`s of the checked COCO-format index a subclass reads (`index`).

    Training uses DETR's augmentation (flip; shortest side from `scales`, longest <=
    `max_size`, or resize, random-size crop, resize); evaluation resizes the shortest side to
    `eval_short_side`. A subclass sets `category_ids` (the JSON's ids, in label order),
    `class_names` and `num_classes` in `__init__`, and for a keypoint dataset
    `keypoint_schema` (the task checks its head's K against it) once it has read it: at
    construction where it can, else when a split is read; None for plain detection. A
    keypoint dataset's transforms move the keypoints and flip them by its `flip_index`;
    `hflip` is the flip's probability (a subclass turns flips off when it cannot know how
    the keypoints swap).

    Args:
        img_size: the backbone's native input size (its position embeddings are resampled
            to every image's own grid); not the size images are resized to.
        scales, max_size, crop_scales, crop_size: DETR's training resize and crop settings.
        eval_short_side: shortest side in evaluation (DETR: 800).
        square_resize: resize to squares instead (RF-DETR's `SquareResize`): `scales` and
            `eval_short_side` are then the sides of S x S images, `max_size` is unused.
        loader, backbone, mean, std, predict_dir: see `ImageDataModule`.
    """

    sample_type: ClassVar[type] = DetectedImages

    category_ids: list[int]
    keypoint_schema: KeypointSchema | None = None

    def __init__(
        self,
        *,
        img_size: int,
        scales: list[int],
        max_size: int | None,
        crop_scales: list[int],
        crop_size: tuple[int, int],
        eval_short_side: int,
        loader: LoaderConfig,
        square_resize: bool = False,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        predict_dir: str | None = None,
    ) -> None:
        super().__init__(
            img_size=img_size, loader=loader, backbone=backbone, mean=mean, std=std, predict_dir=predict_dir
        )
        require_positive(
            scales=scales,
            max_size=max_size,
            crop_scales=crop_scales,
            crop_size=crop_size,
            eval_short_side=eval_short_side,
        )
        self.scales, self.max_size = list(scales), max_size
        self.crop_scales, self.crop_size = list(crop_scales), tuple(crop_size)
        self.eval_short_side = eval_short_side
        self.square_resize = square_resize
        self.hflip = 0.5

    def index(self, split: str) -> CocoIndex:
        """The checked COCO-format index of `split` ("train", "val" or "test")."""
        raise NotImplementedError(f"{type(self).__name__} must implement index")

    def train_transforms(self) -> A.Compose:
        return self.seeded(
            detection_train_transforms(
                self.mean,
                self.std,
                self.scales,
                self.max_size,
                self.crop_scales,
                self.crop_size,
                hflip=self.hflip,
                square=self.square_resize,
                keypoints=self.keypoint_schema,
            )
        )

    def eval_transforms(self) -> A.Compose:
        return detection_eval_transforms(
            self.mean,
            self.std,
            self.eval_short_side,
            self.max_size,
            square=self.square_resize,
            keypoints=self.keypoint_schema,
        )

    def setup_splits(self, stage: str) -> None:
        # each split is read before its transforms are built: reading sets `keypoint_schema`
        if stage == "fit":
            train = self.index("train")
            self.train_dataset = CocoDetection(train, self.train_transforms(), with_eval_targets=False)
        if stage in ("fit", "validate", "predict"):
            val = self.index("val")
            self.val_dataset = self.predict_dataset = CocoDetection(val, self.eval_transforms())
        if stage == "test":
            test = self.index("test")
            self.test_dataset = CocoDetection(test, self.eval_transforms())

    def preprocess(self) -> Preprocess:
        if self.square_resize:
            return Preprocess("square", self.eval_short_side, self.mean, self.std)
        return Preprocess("short_side", self.eval_short_side, self.mean, self.std, max_size=self.max_size)
