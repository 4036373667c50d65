"""Semantic segmentation: folders of images and PNG label maps, the family's DataModule
base and its predict sample.

The on-disk layout is ADE20K's (ADEChallengeData2016), also the generic one for users' own
datasets:

    <root>/images/<split>/<name>.jpg
    <root>/annotations/<split>/<name>.png     single-channel, pixel value = class index

Images and label maps are paired by file name stem. Datasets yield
`SegmentedImages.of(image [3, H, W], mask [h, w], index)`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import albumentations as A
import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from vitdense.core.errors import DataError
from vitdense.core.images import apply_orientation, read_image
from vitdense.core.preprocess import Preprocess
from vitdense.data.base import ImageDataModule, LoaderConfig, Triple, require_positive
from vitdense.data.transforms.segmentation import segmentation_eval_transforms, segmentation_train_transforms
from vitdense.types import SegmentedImages

_logger = logging.getLogger(__name__)

LAYOUT = "<root>/images/<split>/<name>.jpg with <root>/annotations/<split>/<name>.png"

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


#: Segmenter's ADE20K batch of 8 crops; evaluation takes whole images of different sizes one by one
SEGMENTATION_LOADER = LoaderConfig(batch_size=8, eval_batch_size=1)


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
        train_split, val_split: split folder names; predictions run on `val_split`.
        test_split: split to test on (needs label maps); none by default.
        image_suffix, mask_suffix: file name endings of images and label maps.
        loader, backbone, mean, std: see `ImageDataModule`.
        predict_dir: predict on this folder of images instead of `val_split` (see `ImageDataModule`).
    """

    sample_type: ClassVar[type] = SegmentedImages

    #: what a missing root should have been; subclasses name their dataset and where to get it
    layout_help = f"expected the layout {LAYOUT}"
    #: [K, 3] colours of predicted label maps (None: a fixed random palette)
    palette: tuple[tuple[int, int, int], ...] | None = None

    def __init__(
        self,
        *,
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
        train_split: str = "training",
        val_split: str = "validation",
        test_split: str | None = None,
        image_suffix: str = ".jpg",
        mask_suffix: str = ".png",
        loader: LoaderConfig = SEGMENTATION_LOADER,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        predict_dir: str | None = None,
    ) -> None:
        super().__init__(
            img_size=crop_size, loader=loader, backbone=backbone, mean=mean, std=std, predict_dir=predict_dir
        )
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
                raise DataError(
                    f"{self.root}: no test split configured; set data.init_args.test_split to its folder name"
                )
            self.test_dataset = self._split(self.test_split, self.eval_transforms())
        if stage == "predict":
            self.predict_dataset = self._split(self.val_split, self.eval_transforms())

    def preprocess(self) -> Preprocess:
        return Preprocess("rescale", self.eval_short_side, self.mean, self.std, max_size=4 * self.eval_short_side)
