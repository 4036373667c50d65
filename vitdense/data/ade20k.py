"""Semantic segmentation from folders of images and PNG label maps; ADE20K (SceneParsing 150).

The on-disk layout is ADE20K's (ADEChallengeData2016), also the generic one for users' own
datasets:

    <root>/images/<split>/<name>.jpg
    <root>/annotations/<split>/<name>.png     single-channel, pixel value = class index

Images and label maps are paired by file name stem. ADE20K's label maps hold 0 for "other"
(unlabelled) and 1..150 for the classes; `reduce_zero_label` turns them into the ignore
index and 0..149, as mmsegmentation does.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal

import albumentations as A
import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from vitdense.data.base import ImageDataModule, require_positive
from vitdense.data.images import apply_orientation, read_image
from vitdense.data.seg_transforms import segmentation_eval_transforms, segmentation_train_transforms
from vitdense.errors import DataError
from vitdense.types import SegmentedImages

_logger = logging.getLogger(__name__)

Triple = tuple[float, float, float]

LAYOUT = "<root>/images/<split>/<name>.jpg with <root>/annotations/<split>/<name>.png"

#: The 150 classes of ADEChallengeData2016 in label order (label map value k + 1 is class k),
#: as in mmsegmentation's `ADE20KDataset.METAINFO` (whose "bed " carries a stray trailing space,
#: dropped here).
# fmt: off
ADE20K_CLASSES: tuple[str, ...] = (
    "wall", "building", "sky", "floor", "tree", "ceiling", "road", "bed", "windowpane", "grass", "cabinet",
    "sidewalk", "person", "earth", "door", "table", "mountain", "plant", "curtain", "chair", "car", "water",
    "painting", "sofa", "shelf", "house", "sea", "mirror", "rug", "field", "armchair", "seat", "fence", "desk",
    "rock", "wardrobe", "lamp", "bathtub", "railing", "cushion", "base", "box", "column", "signboard",
    "chest of drawers", "counter", "sand", "sink", "skyscraper", "fireplace", "refrigerator", "grandstand", "path",
    "stairs", "runway", "case", "pool table", "pillow", "screen door", "stairway", "river", "bridge", "bookcase",
    "blind", "coffee table", "toilet", "flower", "book", "hill", "bench", "countertop", "stove", "palm",
    "kitchen island", "computer", "swivel chair", "boat", "bar", "arcade machine", "hovel", "bus", "towel", "light",
    "truck", "tower", "chandelier", "awning", "streetlight", "booth", "television receiver", "airplane",
    "dirt track", "apparel", "pole", "land", "bannister", "escalator", "ottoman", "bottle", "buffet", "poster",
    "stage", "van", "ship", "fountain", "conveyer belt", "canopy", "washer", "plaything", "swimming pool", "stool",
    "barrel", "basket", "waterfall", "tent", "bag", "minibike", "cradle", "oven", "ball", "food", "step", "tank",
    "trade name", "microwave", "pot", "animal", "bicycle", "lake", "dishwasher", "screen", "blanket", "sculpture",
    "hood", "sconce", "vase", "traffic light", "tray", "ashcan", "fan", "pier", "crt screen", "plate", "monitor",
    "bulletin board", "shower", "radiator", "glass", "clock", "flag",
)

#: mmsegmentation's RGB colour per class, for overlays (road and skyscraper share (140, 140, 140)).
ADE20K_PALETTE: tuple[tuple[int, int, int], ...] = (
    (120, 120, 120), (180, 120, 120), (6, 230, 230), (80, 50, 50), (4, 200, 3), (120, 120, 80), (140, 140, 140),
    (204, 5, 255), (230, 230, 230), (4, 250, 7), (224, 5, 255), (235, 255, 7), (150, 5, 61), (120, 120, 70),
    (8, 255, 51), (255, 6, 82), (143, 255, 140), (204, 255, 4), (255, 51, 7), (204, 70, 3), (0, 102, 200),
    (61, 230, 250), (255, 6, 51), (11, 102, 255), (255, 7, 71), (255, 9, 224), (9, 7, 230), (220, 220, 220),
    (255, 9, 92), (112, 9, 255), (8, 255, 214), (7, 255, 224), (255, 184, 6), (10, 255, 71), (255, 41, 10),
    (7, 255, 255), (224, 255, 8), (102, 8, 255), (255, 61, 6), (255, 194, 7), (255, 122, 8), (0, 255, 20),
    (255, 8, 41), (255, 5, 153), (6, 51, 255), (235, 12, 255), (160, 150, 20), (0, 163, 255), (140, 140, 140),
    (250, 10, 15), (20, 255, 0), (31, 255, 0), (255, 31, 0), (255, 224, 0), (153, 255, 0), (0, 0, 255),
    (255, 71, 0), (0, 235, 255), (0, 173, 255), (31, 0, 255), (11, 200, 200), (255, 82, 0), (0, 255, 245),
    (0, 61, 255), (0, 255, 112), (0, 255, 133), (255, 0, 0), (255, 163, 0), (255, 102, 0), (194, 255, 0),
    (0, 143, 255), (51, 255, 0), (0, 82, 255), (0, 255, 41), (0, 255, 173), (10, 0, 255), (173, 255, 0),
    (0, 255, 153), (255, 92, 0), (255, 0, 255), (255, 0, 245), (255, 0, 102), (255, 173, 0), (255, 0, 20),
    (255, 184, 184), (0, 31, 255), (0, 255, 61), (0, 71, 255), (255, 0, 204), (0, 255, 194), (0, 255, 82),
    (0, 10, 255), (0, 112, 255), (51, 0, 255), (0, 194, 255), (0, 122, 255), (0, 255, 163), (255, 153, 0),
    (0, 255, 10), (255, 112, 0), (143, 255, 0), (82, 0, 255), (163, 255, 0), (255, 235, 0), (8, 184, 170),
    (133, 0, 255), (0, 255, 92), (184, 0, 255), (255, 0, 31), (0, 184, 255), (0, 214, 255), (255, 0, 112),
    (92, 255, 0), (0, 224, 255), (112, 224, 255), (70, 184, 160), (163, 0, 255), (153, 0, 255), (71, 255, 0),
    (255, 0, 163), (255, 204, 0), (255, 0, 143), (0, 255, 235), (133, 255, 0), (255, 0, 235), (245, 0, 255),
    (255, 0, 122), (255, 245, 0), (10, 190, 212), (214, 255, 0), (0, 204, 255), (20, 0, 255), (255, 255, 0),
    (0, 153, 255), (0, 41, 255), (0, 255, 204), (41, 0, 255), (41, 255, 0), (173, 0, 255), (0, 245, 255),
    (71, 0, 255), (122, 0, 255), (0, 255, 184), (0, 92, 255), (184, 255, 0), (0, 133, 255), (255, 214, 0),
    (25, 194, 194), (102, 255, 0), (92, 0, 255),
)
# fmt: on

#: PIL modes whose pixel values are class indices (a palette PNG's values are its palette indices)
LABEL_MODES = ("L", "P", "I", "I;16", "1")


def read_label_map(path: str | Path) -> np.ndarray:
    """Read a single-channel label map as a [H, W] int32 array of its pixel values.

    A palette ("P") PNG yields its palette indices, not its colours: that is how ADE20K-style
    tools store class indices while showing colours.

    Raises:
        ValueError: the file is unreadable, or holds colour (RGB) rather than class indices.
    """
    try:
        with Image.open(path) as img:
            mode = img.mode
            values = np.asarray(img) if mode in LABEL_MODES else None
    except FileNotFoundError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise DataError(f"{path}: corrupt or unreadable label map ({err}); replace or delete the file") from err
    if values is None:
        raise DataError(
            f"{path}: label map in PIL mode {mode!r}; expected a single-channel PNG ({', '.join(LABEL_MODES)}) "
            "whose pixel values are class indices; convert colour-coded masks to indices first"
        )
    return values.astype(np.int32)


def _files_by_stem(folder: Path, suffix: str, kind: str) -> dict[str, Path]:
    """{stem: path} of the non-hidden files in `folder` ending in `suffix` (any case); others are counted."""
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such directory; expected the layout {LAYOUT}")
    found: dict[str, Path] = {}
    skipped = 0
    for path in sorted(folder.iterdir()):
        if not path.is_file() or path.name.startswith(".") or path.suffix.lower() != suffix.lower():
            skipped += path.is_file()
            continue
        if path.stem in found:
            raise DataError(f"{found[path.stem]} and {path}: two {kind} files with one name; keep one")
        found[path.stem] = path
    if not found:
        raise DataError(f"{folder}: no {kind} files ending in {suffix}; expected the layout {LAYOUT}")
    if skipped:
        _logger.warning("%s: skipped %d files that are not %s files (%s)", folder, skipped, kind, suffix)
    return found


def _unpaired(stems: Sequence[str], folder: Path, suffix: str) -> str:
    listing = ", ".join(f"{stem}{suffix}" for stem in stems[:5]) + (", ..." if len(stems) > 5 else "")
    return f"{len(stems)} missing from {folder} ({listing})"


class SegmentationFolderDataset(Dataset):
    """Images and their label maps, paired by file name stem.

    Args:
        image_dir: folder of images (`image_suffix`), read as RGB.
        mask_dir: folder of single-channel label maps (`mask_suffix`), one per image, of the
            image's size; pixel value = class index (see `read_label_map`).
        transform: albumentations-style callable, `transform(image=[H, W, 3] uint8, mask=[H, W])`
            -> {"image": [3, H', W'] float, "mask": [h, w] int64}; see `seg_transforms`.
        num_classes: number of classes; label values (after reduction) must lie in
            0..num_classes-1 or equal `ignore_index`.
        image_suffix, mask_suffix: file name endings, compared case-insensitively.
        reduce_zero_label: map label 0 to `ignore_index` and k to k - 1 (ADE20K's 0 is
            "other"); `ignore_index` itself stays ignored.
        ignore_index: label of unlabelled pixels.

    Raises:
        FileNotFoundError: a folder is missing.
        ValueError: a folder is empty, or an image has no label map or a label map no image
            (the files are named; nothing is dropped silently).
    """

    def __init__(
        self,
        image_dir: str | Path,
        mask_dir: str | Path,
        transform: Callable[..., dict[str, Any]],
        num_classes: int,
        image_suffix: str = ".jpg",
        mask_suffix: str = ".png",
        reduce_zero_label: bool = False,
        ignore_index: int = 255,
    ) -> None:
        self.image_dir = Path(image_dir)
        self.mask_dir = Path(mask_dir)
        self.transform = transform
        self.num_classes = num_classes
        self.reduce_zero_label = reduce_zero_label
        self.ignore_index = ignore_index
        images = _files_by_stem(self.image_dir, image_suffix, "image")
        masks = _files_by_stem(self.mask_dir, mask_suffix, "label map")
        no_mask = sorted(images.keys() - masks.keys())
        no_image = sorted(masks.keys() - images.keys())
        if no_mask or no_image:
            problems = []
            if no_mask:
                problems.append(f"label maps for {_unpaired(no_mask, self.mask_dir, mask_suffix)}")
            if no_image:
                problems.append(f"images for {_unpaired(no_image, self.image_dir, image_suffix)}")
            raise DataError(
                f"{self.image_dir}: images and label maps do not pair up by name: {'; '.join(problems)}; "
                "add the missing files or remove their partners"
            )
        self.samples: list[tuple[Path, Path]] = [(images[stem], masks[stem]) for stem in sorted(images)]
        # uint8 is what cv2 resizes and pads fastest; wider labels (many classes) stay int32
        self._compact = np.uint8 if 0 <= ignore_index <= 255 and num_classes <= 256 else np.int32

    def __len__(self) -> int:
        return len(self.samples)

    def _allowed_labels(self) -> str:
        if self.reduce_zero_label:
            return f"0 (ignored), 1..{self.num_classes} and {self.ignore_index} (ignored)"
        return f"0..{self.num_classes - 1} and {self.ignore_index} (ignored)"

    def load_mask(self, path: str | Path) -> np.ndarray:
        """[H, W] class indices of one label map, reduced and checked, as uint8 (or int32 if wider).

        Raises:
            ValueError: the label map holds values that are neither a class nor ignored.
        """
        labels = read_label_map(path)
        if self.reduce_zero_label:
            ignored = (labels == 0) | (labels == self.ignore_index)
            labels = labels - 1
            labels[ignored] = self.ignore_index
        bad = ((labels < 0) | (labels >= self.num_classes)) & (labels != self.ignore_index)
        if bad.any():
            values = np.unique(labels[bad]) + (1 if self.reduce_zero_label else 0)  # as stored in the file
            raise DataError(
                f"{path}: label values {values.tolist()[:20]} are not classes; with num_classes={self.num_classes} "
                f"and reduce_zero_label={self.reduce_zero_label} the file may hold {self._allowed_labels()}; "
                "fix the label map, or num_classes / reduce_zero_label / ignore_index"
            )
        return labels.astype(self._compact)

    def __getitem__(self, index: int) -> SegmentedImages:
        image_path, mask_path = self.samples[index]
        pixels, code = read_image(image_path)
        mask = self.load_mask(mask_path)
        image = apply_orientation(pixels, code)
        if pixels.shape[:2] == mask.shape:
            # drawn on the pixels as stored: the label map turns upright with its image
            mask = apply_orientation(mask, code)
        elif image.shape[:2] != mask.shape:  # else drawn on the upright image already
            raise DataError(
                f"{image_path} is {image.shape[0]}x{image.shape[1]} (HxW) but its label map {mask_path} is "
                f"{mask.shape[0]}x{mask.shape[1]}; a label map must match its image pixel for pixel"
            )
        out = self.transform(image=image, mask=mask)
        image_t = out["image"]
        mask_t = torch.as_tensor(out["mask"], dtype=torch.int64)
        return SegmentedImages.of(image_t, mask_t, index)


class SegmentationDataModule(ImageDataModule):
    """Folders of images and PNG label maps: `root/<img_dir>/<split>/*.jpg`, `root/<ann_dir>/<split>/*.png`.

    Training follows mmseg's ADE20K recipe (`segmentation_train_transforms`): random
    keep-ratio resize, a `crop_size` crop no class dominates, flip, photometric distortion,
    padding. Evaluation resizes images to a short side of `eval_short_side` and keeps label
    maps at full resolution (`segmentation_eval_transforms`). Every loader batches with
    `pad_collate`.

    `num_classes`, `class_names`, `img_size` (= `crop_size`) and `ignore_index` are set on
    construction, so the CLI can link them into the task; no file is read until `setup`.

    Args:
        root: dataset folder.
        class_names: class names in label order (label value k, after reduction, is class k).
        img_dir, ann_dir: sub-folders of `root` holding one folder per split.
        ignore_index: label of unlabelled pixels; excluded from the loss and metrics.
        reduce_zero_label: treat label 0 as unlabelled and shift 1..N to 0..N-1 (ADE20K).
        crop_size: side of the square training crops.
        scale, ratio_range: training resize bound at ratio 1 and the ratio's range.
        cat_max_ratio: largest share of a training crop one class may take (1 disables it).
        eval_short_side: short side of evaluation images (long side at most 4x this).
        batch_size, eval_batch_size: training and evaluation batch sizes (None: = batch_size).
        num_workers: loader worker processes.
        backbone: timm model name whose pretrained normalisation to use (see `normalization`).
        mean, std: explicit normalisation; each wins over the backbone's.
        train_split, val_split: split folder names; predictions run on `val_split`.
        test_split: split to test on (needs label maps); none by default.
        image_suffix, mask_suffix: file name endings of images and label maps.
        predict_dir: predict on this folder of images instead of `val_split` (see `ImageDataModule`).
    """

    #: what a missing root should have been; subclasses name their dataset and where to get it
    layout_help = f"expected the layout {LAYOUT}"
    #: [K, 3] colours of predicted label maps (None: a fixed random palette)
    palette: tuple[tuple[int, int, int], ...] | None = None

    def __init__(
        self,
        root: str,
        class_names: list[str],
        img_dir: str = "images",
        ann_dir: str = "annotations",
        ignore_index: int = 255,
        reduce_zero_label: bool = False,
        crop_size: int = 512,
        scale: tuple[int, int] = (2048, 512),
        ratio_range: tuple[float, float] = (0.5, 2.0),
        cat_max_ratio: float = 0.75,
        eval_short_side: int = 512,
        batch_size: int = 8,
        eval_batch_size: int | None = 1,
        num_workers: int = 4,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        train_split: str = "training",
        val_split: str = "validation",
        test_split: str | None = None,
        image_suffix: str = ".jpg",
        mask_suffix: str = ".png",
        predict_dir: str | None = None,
        on_bad_sample: Literal["raise", "skip"] = "raise",
    ) -> None:
        super().__init__(
            crop_size, batch_size, eval_batch_size, num_workers, backbone, mean, std, predict_dir, on_bad_sample
        )
        # the encoder name only picks mean and std (kept as attributes); the task logs it already
        self.save_hyperparameters(ignore=["backbone"])
        self.root = Path(root)
        require_positive(
            scale=scale, ratio_range=ratio_range, cat_max_ratio=cat_max_ratio, eval_short_side=eval_short_side
        )
        if not self.root.is_dir() and predict_dir is None:  # predicting on a folder needs no dataset
            raise FileNotFoundError(f"{self.root}: no such directory; {self.layout_help}")
        self.class_names = list(class_names)
        if not self.class_names or len(set(self.class_names)) != len(self.class_names):
            raise DataError(f"class_names for {self.root} must be non-empty and unique, got {self.class_names}")
        self.num_classes = len(self.class_names)
        if 0 <= ignore_index < self.num_classes:
            raise DataError(
                f"ignore_index={ignore_index} is also class {self.class_names[ignore_index]!r} of {self.num_classes}; "
                "pick an ignore_index outside 0..num_classes-1 (255 is usual)"
            )
        self.ignore_index = ignore_index
        # settings live in attributes, not `hparams`: a subclass with a narrower signature
        # (ADE20KDataModule) saves only its own arguments as hyperparameters
        self.img_dir, self.ann_dir = img_dir, ann_dir
        self.reduce_zero_label = reduce_zero_label
        self.crop_size = crop_size
        self.scale = tuple(scale)
        self.ratio_range = tuple(ratio_range)
        self.cat_max_ratio = cat_max_ratio
        self.eval_short_side = eval_short_side
        self.train_split, self.val_split, self.test_split = train_split, val_split, test_split
        self.image_suffix, self.mask_suffix = image_suffix, mask_suffix

    @property
    def train_location(self) -> str:
        return str(self.root / self.img_dir / self.train_split)

    def train_transforms(self) -> A.Compose:
        transform = segmentation_train_transforms(
            crop_size=self.crop_size,
            scale=self.scale,
            ratio_range=self.ratio_range,
            cat_max_ratio=self.cat_max_ratio,
            ignore_index=self.ignore_index,
            mean=self.mean,
            std=self.std,
        )
        return self.seeded(transform)

    def eval_transforms(self) -> A.Compose:
        return segmentation_eval_transforms(self.eval_short_side, self.mean, self.std)

    def _split(self, split: str, transform: Callable[..., dict[str, Any]]) -> SegmentationFolderDataset:
        return SegmentationFolderDataset(
            self.root / self.img_dir / split,
            self.root / self.ann_dir / split,
            transform,
            num_classes=self.num_classes,
            image_suffix=self.image_suffix,
            mask_suffix=self.mask_suffix,
            reduce_zero_label=self.reduce_zero_label,
            ignore_index=self.ignore_index,
        )

    def setup_splits(self, stage: str) -> None:
        if stage == "fit":
            self.train_dataset = self._split(self.train_split, self.train_transforms())
        if stage in ("fit", "validate"):
            self.val_dataset = self._split(self.val_split, self.eval_transforms())
        if stage == "test":
            if self.test_split is None:
                raise DataError(f"{self.root}: no test split configured; set data.test_split to its folder name")
            self.test_dataset = self._split(self.test_split, self.eval_transforms())
        if stage == "predict":
            self.predict_dataset = self._split(self.val_split, self.eval_transforms())

    def predict_sample(self) -> Callable[[np.ndarray, int], SegmentedImages]:
        return partial(segmented_sample, self.eval_transforms(), self.ignore_index)


def segmented_sample(
    transform: Callable[..., dict[str, Any]], ignore_index: int, image: np.ndarray, index: int
) -> SegmentedImages:
    """An unlabelled image for a segmentation task's `predict_step`: its label map is all
    `ignore_index` at the image's own size, the size predictions are made at."""
    mask = torch.full(image.shape[:2], ignore_index, dtype=torch.int64)
    return SegmentedImages.of(transform(image=image)["image"], mask, index)


class ADE20KDataModule(SegmentationDataModule):
    """ADE20K's SceneParsing benchmark (ADEChallengeData2016): 150 classes, 20210 training
    and 2000 validation images, with mmseg/Segmenter's augmentation.

    Label 0 ("other") is ignored and 1..150 become 0..149 (`ADE20K_CLASSES`). `test` runs
    on the validation split, where published results are measured. Download,
    check and extract the data with `python data_scripts/ade20k.py`.

    Args:
        root: the extracted ADEChallengeData2016 folder.
        Others: see `SegmentationDataModule`.
    """

    palette = ADE20K_PALETTE
    layout_help = (
        "expected ADE20K's extracted ADEChallengeData2016 folder, holding images/{training,validation}/*.jpg and "
        "annotations/{training,validation}/*.png; download and extract it with data_scripts/ade20k.py "
        "(see data_scripts/), or point data.root at it"
    )

    def __init__(
        self,
        root: str = "data/ade/ADEChallengeData2016",
        crop_size: int = 512,
        scale: tuple[int, int] = (2048, 512),
        ratio_range: tuple[float, float] = (0.5, 2.0),
        cat_max_ratio: float = 0.75,
        eval_short_side: int = 512,
        batch_size: int = 8,
        eval_batch_size: int | None = 1,
        num_workers: int = 4,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        train_split: str = "training",
        val_split: str = "validation",
        predict_dir: str | None = None,
        on_bad_sample: Literal["raise", "skip"] = "raise",
    ) -> None:
        super().__init__(
            root,
            class_names=list(ADE20K_CLASSES),
            reduce_zero_label=True,
            crop_size=crop_size,
            scale=scale,
            ratio_range=ratio_range,
            cat_max_ratio=cat_max_ratio,
            eval_short_side=eval_short_side,
            batch_size=batch_size,
            eval_batch_size=eval_batch_size,
            num_workers=num_workers,
            backbone=backbone,
            mean=mean,
            std=std,
            train_split=train_split,
            val_split=val_split,
            test_split=val_split,  # ADE20K's labelled benchmark split: published mIoUs are on validation
            predict_dir=predict_dir,
            on_bad_sample=on_bad_sample,
        )
        # drop the parent's arguments this signature fixes (class_names, reduce_zero_label, ...),
        # so that ADE20KDataModule(**hparams) rebuilds it from a checkpoint
        fixed = (
            inspect.signature(SegmentationDataModule).parameters.keys()
            - inspect.signature(type(self)).parameters.keys()
        )
        self.save_hyperparameters(ignore=["backbone", *sorted(fixed)])
