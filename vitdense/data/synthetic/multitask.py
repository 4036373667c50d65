"""Offline co-annotated scenes: one rendered room, three kinds of labels (boxes, segments,
depth), so that a `MultiTask` trains every head from one encoder pass.

The rooms are `vitdense.data.synthetic.depth`'s (a pinhole camera over a chequered floor
before a wall, boxes and spheres standing on the floor, depth ray-traced), and each pixel's
surface is known, so each scene has

    depth      [H, W] float32 metres, every pixel (0.5 to 9.5 m)
    segments   [H, W] int64: 0 wall, 1 floor, 2 box, 3 sphere (`SEGMENT_CLASSES`)
    boxes      each object's visible extent (x1, y1, x2, y2) pixels and its class, 0 box,
               1 sphere (`OBJECT_CLASSES`); objects hidden to fewer than `MIN_PIXELS` are left out

Every scene is a pure function of (seed, split, index), rendered when it is read.

    SyntheticSceneLabelsDataModule(kind="det" | "seg" | "depth")   one kind of labels: a single
        task's DataModule (the same scenes, to train a task alone and compare)
    SyntheticScenesDataModule(labels={"det": "det", "seg": "seg", "depth": "depth"})
        a `MultiTaskDataModule` whose training batches hold every task's labels OF THE SAME
        IMAGES, augmented once (one crop, one flip): the tasks' batches then hold equal
        images, and `MultiTask` encodes them once (`VisionTransformer.one_pass`). Evaluation
        runs each task on the whole validation scenes, as its view alone does.

Scenes are `img_size` x 4/3 `img_size` (to whole 16 pixels; NYU's 3:4); training takes random
`img_size` squares, flipped half of the time.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import albumentations as A
import numpy as np
import torch
from albumentations.pytorch import ToTensorV2
from torch.utils.data import DataLoader, Dataset

from vitdense.core.errors import ConfigError
from vitdense.core.preprocess import Preprocess
from vitdense.data.base import (
    ImageDataModule,
    LoaderConfig,
    Triple,
    check_train_size,
    image_dataloader,
    loader_machine,
)
from vitdense.data.multitask import MultiTaskDataModule
from vitdense.data.synthetic.classification import split_seed
from vitdense.data.synthetic.depth import render_surfaces
from vitdense.types import DepthImages, DetectedImages, SegmentedImages
from vitdense.types.collate import pad_collate
from vitdense.types.detection import BoxTargets, EvalTargets

#: which labels a task learns from the scenes
Kind = Literal["det", "seg", "depth"]
KINDS: tuple[str, ...] = ("det", "seg", "depth")
#: the segment classes, by index
SEGMENT_CLASSES = ("wall", "floor", "box", "sphere")
#: the object classes, by index (COCO category ids 1, 2)
OBJECT_CLASSES = ("box", "sphere")
#: an object shows at least this many pixels to be annotated
MIN_PIXELS = 6
SAMPLE_TYPES: dict[str, type] = {"det": DetectedImages, "seg": SegmentedImages, "depth": DepthImages}


def labeled_scene(height: int, width: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One room with its three kinds of labels: {"image": [H, W, 3] uint8, "depth": [H, W]
    float32 metres, "segments": [H, W] int64, "boxes": [n, 4] float32 (x1, y1, x2, y2) pixels,
    "labels": [n] int64}."""
    image, depth, _, surface, kinds = render_surfaces(height, width, rng)
    segments = np.minimum(surface, 1)  # wall 0, floor 1
    boxes, labels = [], []
    for k, kind in enumerate(kinds):
        where = surface == k + 2
        segments[where] = 2 + OBJECT_CLASSES.index(kind)
        if where.sum() < MIN_PIXELS:
            continue
        rows, cols = np.nonzero(where)
        boxes.append([cols.min(), rows.min(), cols.max() + 1, rows.max() + 1])
        labels.append(OBJECT_CLASSES.index(kind))
    return {
        "image": image,
        "depth": depth,
        "segments": segments.astype(np.int64),
        "boxes": np.asarray(boxes, dtype=np.float32).reshape(-1, 4),
        "labels": np.asarray(labels, dtype=np.int64),
    }


def scene_size(img_size: int) -> tuple[int, int]:
    """(H, W) of the scenes: NYU's 3:4, the width in whole 16 pixels."""
    return img_size, max(16, round(img_size * 4 / 3 / 16) * 16)


def train_transform(img_size: int, mean: Triple, std: Triple) -> A.Compose:
    """One random `img_size` square and a flip for the image and every label (boxes cut to
    the crop; one whose visible part is under a third of it is left out)."""
    return A.Compose(
        [
            A.RandomCrop(img_size, img_size),
            A.HorizontalFlip(p=0.5),
            A.Normalize(mean=mean, std=std, max_pixel_value=255.0),
            ToTensorV2(),
        ],
        bbox_params=A.BboxParams(format="pascal_voc", label_fields=["labels"], min_visibility=0.3, min_area=4),
    )


def eval_transform(mean: Triple, std: Triple) -> A.Compose:
    """Whole scenes, normalised (the boxes need no processing)."""
    return A.Compose([A.Normalize(mean=mean, std=std, max_pixel_value=255.0), ToTensorV2()])


def sample_of(kind: str, out: dict[str, Any], index: int, image: torch.Tensor | None = None) -> Any:
    """The sample of `kind` from a transformed scene `out` (its image, or `image` given)."""
    image = out["image"] if image is None else image
    height, width = image.shape[-2:]
    if kind == "seg":
        return SegmentedImages.of(image, torch.as_tensor(out["masks"][0], dtype=torch.int64), index)
    if kind == "depth":
        return DepthImages.of(image, torch.as_tensor(out["masks"][1], dtype=torch.float32), index)
    xyxy = torch.as_tensor(np.asarray(out["bboxes"], dtype=np.float32).reshape(-1, 4))
    labels = torch.as_tensor(np.asarray(out["labels"]), dtype=torch.int64).reshape(-1)  # (floats from albumentations)
    scale = torch.tensor([width, height, width, height], dtype=torch.float32)
    cxcywh = torch.cat([(xyxy[:, :2] + xyxy[:, 2:]) / 2, xyxy[:, 2:] - xyxy[:, :2]], 1) / scale
    area = (xyxy[:, 2] - xyxy[:, 0]) * (xyxy[:, 3] - xyxy[:, 1])
    evaluated = EvalTargets(xyxy, labels, torch.zeros_like(labels), area)
    return DetectedImages(image, BoxTargets(cxcywh, labels), index, (height, width), (height, width), evaluated)


class Scenes(Dataset):
    """A split's scenes as samples of the `kinds` asked: one kind -> that kind's sample; several
    -> {name: sample}, every sample holding the one augmented image.

    Args:
        kinds: {name: kind} of the samples to make.
        length, size, seed: how many scenes, (H, W), the split's seed.
        transform: the albumentations pipeline (`train_transform`, `eval_transform`).
    """

    def __init__(self, kinds: dict[str, str], length: int, size: tuple[int, int], seed: int, transform: A.Compose):
        self.kinds, self.length, self.size, self.seed, self.transform = kinds, length, size, seed, transform

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        scene = labeled_scene(*self.size, np.random.default_rng([self.seed, index]))
        boxes = {"bboxes": scene["boxes"], "labels": scene["labels"]}
        moves_boxes = "bboxes" in self.transform.processors  # (training's crop and flip; evaluation keeps them)
        out = self.transform(
            image=scene["image"], masks=[scene["segments"], scene["depth"]], **(boxes if moves_boxes else {})
        )
        out = out if moves_boxes else {**out, **boxes}
        samples = {name: sample_of(kind, out, index) for name, kind in self.kinds.items()}
        return next(iter(samples.values())) if len(samples) == 1 else samples


SCENES_LOADER = LoaderConfig(batch_size=16)


class SyntheticSceneLabelsDataModule(ImageDataModule):
    """The co-annotated scenes (module docstring) with one `kind` of labels: boxes ("det",
    2 classes), segments ("seg", 4 classes) or depth ("depth"). A single task's DataModule,
    and each task's view inside `SyntheticScenesDataModule`.

    Args:
        kind: which labels.
        img_size: the training crops' side and the scenes' height.
        train_size, val_size: scenes per split (test and predict use the validation scenes).
        seed: base seed of the generator.
        loader, backbone, mean, std, predict_dir: see `ImageDataModule`.
    """

    def __init__(
        self,
        *,
        kind: Kind = "seg",
        img_size: int = 64,
        train_size: int = 2000,
        val_size: int = 200,
        seed: int = 0,
        loader: LoaderConfig = SCENES_LOADER,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        predict_dir: str | None = None,
    ) -> None:
        super().__init__(
            img_size=img_size, loader=loader, backbone=backbone, mean=mean, std=std, predict_dir=predict_dir
        )
        if kind not in KINDS:
            raise ConfigError(f"data.init_args.kind={kind!r}: choose among {list(KINDS)}")
        self.kind = kind
        self.class_names = {"det": list(OBJECT_CLASSES), "seg": list(SEGMENT_CLASSES), "depth": ["depth"]}[kind]
        self.num_classes = len(self.class_names)
        self.train_size, self.val_size, self.seed = train_size, val_size, seed

    @property
    def sample_type(self) -> type:  # type: ignore[override]
        return SAMPLE_TYPES[self.kind]

    #: COCO category ids of the object classes (detection results name them)
    category_ids: ClassVar[tuple[int, ...]] = (1, 2)

    def split(self, name: str, kinds: dict[str, str] | None = None) -> Scenes:
        seed, length = split_seed(self.seed, name, self.train_size, self.val_size)
        transform = (
            self.seeded(train_transform(self.img_size, self.mean, self.std))
            if name == "train"
            else eval_transform(self.mean, self.std)
        )
        return Scenes(kinds or {self.kind: self.kind}, length, scene_size(self.img_size), seed, transform)

    def setup_splits(self, stage: str) -> None:
        if stage == "fit":
            self.train_dataset = self.split("train")
        if stage in ("fit", "validate"):
            self.val_dataset = self.split("val")
        if stage == "test":
            self.test_dataset = self.split("test")
        if stage == "predict":
            self.predict_dataset = self.split("val")

    def preprocess(self) -> Preprocess:
        return Preprocess("none", None, self.mean, self.std)


class SyntheticScenesDataModule(MultiTaskDataModule):
    """Co-annotated scenes for a `MultiTask`: each task's labels of the same images (module
    docstring). Training batches are {name: that task's batch}, every one holding the same
    augmented images: the encoder runs once per step for all the tasks. Evaluation and
    prediction run each task's own view (`SyntheticSceneLabelsDataModule`) in turn.

    Args:
        labels: {task name: kind of labels} ("det", "seg", "depth"), the names of the
            model's `tasks`.
        img_size, train_size, val_size, seed, loader, mean, std, predict_dir: every view's
            (`SyntheticSceneLabelsDataModule`); `loader.batch_size` images per step, each
            with all its labels.
        backbone: the encoder's timm name (the command line links the first task's).
    """

    def __init__(
        self,
        *,
        labels: dict[str, Kind] | None = None,
        img_size: int = 64,
        train_size: int = 2000,
        val_size: int = 200,
        seed: int = 0,
        loader: LoaderConfig = SCENES_LOADER,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        predict_dir: str | None = None,
    ) -> None:
        self.labels = dict(labels or {"det": "det", "seg": "seg", "depth": "depth"})
        common = dict(img_size=img_size, train_size=train_size, val_size=val_size, seed=seed, loader=loader)
        views = {
            name: SyntheticSceneLabelsDataModule(kind=kind, **common, backbone=backbone, mean=mean, std=std)
            for name, kind in self.labels.items()
        }
        super().__init__(views, backbone=backbone, predict_dir=predict_dir)
        self.train_set: Scenes | None = None

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if stage == "fit":  # one set of scenes for every task: the first view's training split, all labels
            first = next(iter(self.tasks.values()))
            self.train_set = first.split("train", self.labels)

    def train_dataloader(self) -> DataLoader:
        first = next(iter(self.tasks.values()))
        check_train_size(self.train_set, first.loader.batch_size, f"{type(self).__name__} training split")
        loader = first.loader.resolved(*loader_machine(self.trainer))
        return image_dataloader(self.train_set, loader, True, collate_by_name, lambda: self.trainer)


def collate_by_name(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """{name: that task's padded batch} of samples {name: sample}."""
    return {name: pad_collate([s[name] for s in samples]) for name in samples[0]}
