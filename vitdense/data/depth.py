"""Monocular depth: images with 16-bit depth PNGs listed in split files, the layout BTS,
AdaBins, ZoeDepth and Depth Anything read NYU Depth v2 and KITTI in, and their DataModules.

A split file has one sample a line, "<image> <depth> <focal>", paths relative to the split's
image and depth folders (a leading "/" is ignored), the depth "None" where the image has no
ground truth (KITTI's Eigen split: those images are left out, and counted in the log):

    NYU Depth v2   <root>/sync/<scene>/rgb_00000.jpg, sync_depth_00000.png      (train, 24231)
                   <root>/official_splits/test/<scene>/rgb_00000.jpg, ...        (test, 654)
                   nyudepthv2_{train,test}_files_with_gt.txt; depth in mm (value / 1000 = m)
    KITTI (Eigen)  <root>/raw/2011_09_26/2011_09_26_drive_0002_sync/image_02/data/0000000069.png
                   <root>/data_depth_annotated/2011_09_26_drive_0002_sync/proj_depth/groundtruth/image_02/...
                   eigen_train_files_with_gt.txt, eigen_test_files_with_gt.txt; value / 256 = m

A depth value of 0 is "no measurement". Datasets yield `DepthImages.of(image, depth, index)`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar, Literal

import albumentations as A
import cv2
import numpy as np
import torch
from albumentations.pytorch import ToTensorV2
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from vitdense.core.errors import DataError
from vitdense.core.images import read_image, unique_output_names
from vitdense.core.preprocess import Preprocess
from vitdense.data.base import ImageDataModule, LoaderConfig, Triple, require_positive
from vitdense.types.depth import DepthImages

_logger = logging.getLogger(__name__)

#: PIL modes of 16-bit greyscale PNGs ("I" is how some Pillow releases open them)
DEPTH_MODES = ("I;16", "I;16B", "I;16L", "I")


@dataclass(frozen=True)
class DepthEntry:
    """One line of a split file: the image's path, its depth PNG's (None: no ground truth),
    the focal length in pixels, and where it was read (file, line)."""

    image: str
    depth: str | None
    focal: float
    where: str


def read_split_file(path: str | Path, on_bad_sample: Literal["raise", "skip"] = "raise") -> list[DepthEntry]:
    """The samples of a BTS-style split file ("<image> <depth> <focal>" per line; blank
    lines ignored).

    Args:
        path: the split file.
        on_bad_sample: what a malformed line does (`LoaderConfig.on_bad_sample`): "raise"
            stops naming it; "skip" leaves it out, with one warning that counts such lines
            and names the first.

    Raises:
        FileNotFoundError: no such file.
        DataError: a line without three fields, or whose focal length is not a number
            (the file and line are named; with "raise"); no well-formed line at all.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such split file; expected lines '<image> <depth> <focal>'")
    entries, malformed = [], []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        where = f"{path}:{number}"
        problem = None
        if len(fields) != 3:
            problem = (
                f"{where}: {len(fields)} fields in {line.strip()!r}; a split line is '<image> <depth> <focal>' "
                "(depth 'None' where the image has no ground truth)"
            )
        else:
            try:
                focal = float(fields[2])
            except ValueError:
                problem = f"{where}: focal length {fields[2]!r} is not a number"
        if problem is not None:
            if on_bad_sample == "raise":
                raise DataError(problem)
            malformed.append(problem)
            continue
        depth = None if fields[1] == "None" else fields[1].lstrip("/")
        entries.append(DepthEntry(fields[0].lstrip("/"), depth, focal, where))
    if malformed:
        _logger.warning(
            "%s: %d malformed %s left out (on_bad_sample=skip), first %s",
            path,
            len(malformed),
            "line" if len(malformed) == 1 else "lines",
            malformed[0],
        )
    if not entries:
        raise DataError(f"{path}: no samples; expected lines '<image> <depth> <focal>'")
    return entries


def read_depth_png(path: str | Path, scale: float) -> np.ndarray:
    """A 16-bit depth PNG as [H, W] float32 metres (stored value / `scale`; 0 stays 0, no
    measurement).

    Raises:
        FileNotFoundError: no such file.
        DataError: unreadable, or not a 16-bit single-channel PNG (an 8-bit one has lost the
            depth's precision: NYU's and KITTI's maps are 16-bit).
    """
    try:
        with Image.open(path) as img:
            mode = img.mode
            values = np.asarray(img) if mode in DEPTH_MODES else None
    except FileNotFoundError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise DataError(f"{path}: corrupt or unreadable depth PNG ({err}); replace or delete the file") from err
    if values is None:
        raise DataError(
            f"{path}: depth map in PIL mode {mode!r} ({'8-bit' if mode in ('L', 'P', '1') else 'not 16-bit'}); "
            f"depth PNGs are 16-bit greyscale (value / {scale:g} = metres): write them with "
            "PIL.Image.fromarray(depth_uint16) or cv2.imwrite(path, depth.astype(np.uint16))"
        )
    return values.astype(np.float32) / scale


def kb_crop(array: np.ndarray) -> np.ndarray:
    """KITTI's benchmark crop (BTS's `do_kb_crop`): the bottom 352 rows and the centred 1216
    columns, where the projected LiDAR has points."""
    height, width = array.shape[:2]
    top, left = max(height - 352, 0), max((width - 1216) // 2, 0)
    return array[top : top + 352, left : left + 1216]


class DepthFilesDataset(Dataset):
    """The samples of a split file that have ground truth.

    Args:
        image_root, depth_root: folders the split's image and depth paths are relative to.
        entries: the split file's lines (`read_split_file`); those without ground truth are
            left out and counted in the log.
        transform: `transform(image=[H, W, 3] uint8, mask=[H, W] float32 depth)` ->
            {"image": [3, H', W'], "mask": [h, w]} (`depth_train_transforms`, `DepthEvalTransform`).
        depth_scale: stored value per metre (NYU: 1000; KITTI: 256).
        crop_kb: apply KITTI's benchmark crop (`kb_crop`) to both first.
        on_bad_sample: what a listed file that is missing does (`LoaderConfig.on_bad_sample`):
            "raise" stops here, before any training; "skip" leaves its sample out, with one
            warning that counts them and names the first (the files that are there but turn
            out unreadable are `SkipBadSamples`' to skip, when loaded).

    Attributes:
        entries: the samples kept, in the split's order.
        image_paths: each kept sample's image file (the `path` `predict` writes beside it).
        output_names: what `predict` names each sample's files: its image's path in the split
            without the suffix (`unique_output_names`), not the stem alone, since KITTI's drives
            share frame names (.../image_02/data/0000000005.png) and would overwrite each other.

    Raises:
        DataError: listed files are missing (counted, the first named; with "raise"), or no
            sample is left.
    """

    def __init__(
        self,
        image_root: str | Path,
        depth_root: str | Path,
        entries: list[DepthEntry],
        transform: Callable[..., dict[str, Any]],
        depth_scale: float,
        crop_kb: bool = False,
        on_bad_sample: Literal["raise", "skip"] = "raise",
    ) -> None:
        self.image_root, self.depth_root = Path(image_root), Path(depth_root)
        self.transform = transform
        self.depth_scale = depth_scale
        self.crop_kb = crop_kb
        split = entries[0].where.rsplit(":", 1)[0]
        kept = [e for e in entries if e.depth is not None]
        if len(kept) < len(entries):
            _logger.warning(
                "%s: %d of %d samples have no ground truth ('None') and are left out",
                split,
                len(entries) - len(kept),
                len(entries),
            )
        if not kept:
            raise DataError(f"{split}: no sample has ground truth")
        listed = {e: (self.image_root / e.image, self.depth_root / e.depth) for e in kept}
        missing = {e: absent for e, paths in listed.items() if (absent := [p for p in paths if not p.is_file()])}
        if missing:
            first, files = next(iter(missing.items()))
            count = sum(len(f) for f in missing.values())
            if on_bad_sample == "raise":
                raise DataError(
                    f"{count} files listed are missing, first {files[0]} ({first.where}); download and extract the "
                    "dataset (data_scripts/), or fix the split file (or set data.init_args.loader.on_bad_sample: "
                    "skip to leave their samples out)"
                )
            what = (
                f"{len(missing)} of {len(kept)} samples left out (on_bad_sample=skip): {count} listed files are "
                f"missing, first {files[0]} ({first.where})"
            )
            kept = [e for e in kept if e not in missing]
            if not kept:
                raise DataError(f"{split}: no sample is left: {what}")
            _logger.warning("%s: %s", split, what)
        self.entries = kept

    # (computed when predict asks: a training split has tens of thousands of entries)
    @cached_property
    def image_paths(self) -> list[Path]:
        return [self.image_root / e.image for e in self.entries]

    @cached_property
    def output_names(self) -> list[str]:
        return unique_output_names([PurePosixPath(e.image) for e in self.entries])

    def __len__(self) -> int:
        return len(self.entries)

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """(image [H, W, 3] uint8 as stored, depth [H, W] float32 metres), checked.

        Raises:
            DataError: the depth map's size is not the image's, or it holds no measurement.
        """
        entry = self.entries[index]
        image_path, depth_path = self.image_root / entry.image, self.depth_root / entry.depth
        pixels, _ = read_image(image_path)  # as stored: depth maps are registered to the stored pixels
        depth = read_depth_png(depth_path, self.depth_scale)
        if pixels.shape[:2] != depth.shape:
            raise DataError(
                f"{depth_path} is {depth.shape[0]}x{depth.shape[1]} (HxW) but its image {image_path} is "
                f"{pixels.shape[0]}x{pixels.shape[1]} ({entry.where}); a depth map must match its image pixel for pixel"
            )
        if not depth.any():
            raise DataError(
                f"{depth_path}: every value is 0, no measurement ({entry.where}); remove the line or fix the file"
            )
        if self.crop_kb:
            pixels, depth = kb_crop(pixels), kb_crop(depth)
        return pixels, depth

    def __getitem__(self, index: int) -> DepthImages:
        pixels, depth = self.load(index)
        out = self.transform(image=pixels, mask=depth)
        return DepthImages.of(out["image"], torch.as_tensor(out["mask"], dtype=torch.float32), index)


def depth_train_transforms(
    crop_size: tuple[int, int],
    mean: Triple,
    std: Triple,
    rotate: float = 2.5,
    brightness: tuple[float, float] = (0.75, 1.25),
    gamma: tuple[float, float] = (0.9, 1.1),
    colour: tuple[float, float] = (0.9, 1.1),
) -> A.Compose:
    """BTS's training augmentation (which DPT's NYU and KITTI fine-tuning follows): a random
    rotation within ±`rotate` degrees (depth by nearest neighbour, the corners no
    measurement), a random `crop_size` (H, W) crop (padded with no measurement where the
    image is smaller), a horizontal flip, and half of the time gamma, brightness and
    per-channel colour factors drawn from the ranges. The depth map travels as albumentations'
    float32 mask: `transform(image=[H, W, 3] uint8, mask=[H, W] float32)` -> {"image": [3, H, W],
    "mask": [H, W]}."""
    spatial: list[A.BasicTransform] = []
    if rotate:
        spatial.append(
            A.Rotate(
                limit=rotate,
                interpolation=cv2.INTER_LINEAR,
                mask_interpolation=cv2.INTER_NEAREST,
                border_mode=cv2.BORDER_CONSTANT,
                fill=0,
                fill_mask=0,
                p=1.0,
            )
        )
    spatial += [
        A.RandomCrop(*crop_size, pad_if_needed=True, fill=0, fill_mask=0),
        A.HorizontalFlip(p=0.5),
        A.Sequential(
            [
                A.RandomGamma(gamma_limit=(100 * gamma[0], 100 * gamma[1]), p=1.0),
                A.MultiplicativeNoise(multiplier=brightness, per_channel=False, elementwise=False, p=1.0),
                A.MultiplicativeNoise(multiplier=colour, per_channel=True, elementwise=False, p=1.0),
            ],
            p=0.5,
        ),
        A.Normalize(mean=mean, std=std),
        ToTensorV2(),
    ]
    return A.Compose(spatial)


class DepthEvalTransform:
    """Evaluation: the image through the DataModule's `Preprocess` (resized, normalised), the
    depth map kept as measured (metrics are computed at its size)."""

    def __init__(self, preprocess: Preprocess) -> None:
        self.preprocess = preprocess

    def __call__(self, image: np.ndarray, mask: np.ndarray) -> dict[str, torch.Tensor]:
        """As an albumentations pipeline: image [H, W, 3] uint8, mask (depth) [h, w] float32."""
        return {"image": self.preprocess(image), "mask": torch.from_numpy(np.ascontiguousarray(mask))}


#: 8 images (BTS's NYU and KITTI runs: 4); evaluation's images share one size (480 x 640), so they batch unpadded
DEPTH_LOADER = LoaderConfig(batch_size=8)


class DepthDataModule(ImageDataModule):
    """Images and 16-bit depth PNGs listed in split files (module docstring).

    Training: BTS's augmentation (`depth_train_transforms`) to `crop_size` crops, all one
    size (DPT is not padding-invariant). Validation and test: the test split, each image at
    its size (or resized to `eval_short_side`), its depth map as measured; the task resizes
    predictions to it.

    `num_classes` (1) and `class_names` (["depth"]) are set on construction for the CLI's links.

    Args:
        root: dataset folder.
        train_list, test_list: split files, relative to `root`.
        train_images, train_depths, test_images, test_depths: the folders (relative to
            `root`) each split's image and depth paths are relative to.
        depth_scale: stored value per metre (NYU: 1000, mm; KITTI: 256).
        crop_size: (H, W) of the training crops (BTS NYU: 416 x 544; KITTI: 352 x 704).
        img_size: the backbone's native side (its position table's; linked); default
            crop_size's height.
        rotate, brightness, gamma, colour: augmentation (`depth_train_transforms`).
        eval_short_side: resize evaluation images to this short side (None: as they are,
            BTS's and DPT's NYU evaluation at 480 x 640).
        crop_kb: KITTI's benchmark crop (352 x 1216) of every image and depth map first.
        loader, backbone, mean, std, predict_dir: see `ImageDataModule`.
    """

    sample_type: ClassVar[type] = DepthImages
    ignore_index: int = 0  # (no labels; depth maps are padded with 0, no measurement)
    #: what a missing root should have been; subclasses name their dataset and where to get it
    layout_help = "expected split files of '<image> <depth> <focal>' lines (see vitdense.data.depth)"

    def __init__(
        self,
        *,
        root: str,
        train_list: str,
        test_list: str,
        train_images: str = "",
        train_depths: str = "",
        test_images: str = "",
        test_depths: str = "",
        depth_scale: float = 1000.0,
        crop_size: tuple[int, int] = (416, 544),
        img_size: int | None = None,
        rotate: float = 2.5,
        brightness: tuple[float, float] = (0.75, 1.25),
        gamma: tuple[float, float] = (0.9, 1.1),
        colour: tuple[float, float] = (0.9, 1.1),
        eval_short_side: int | None = None,
        crop_kb: bool = False,
        loader: LoaderConfig = DEPTH_LOADER,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        predict_dir: str | None = None,
    ) -> None:
        require_positive(
            depth_scale=depth_scale, crop_size=crop_size, img_size=img_size, eval_short_side=eval_short_side
        )
        super().__init__(
            img_size=img_size or crop_size[0],
            loader=loader,
            backbone=backbone,
            mean=mean,
            std=std,
            predict_dir=predict_dir,
        )
        self.root = Path(root)
        self.num_classes, self.class_names = 1, ["depth"]
        self.train_list, self.test_list = train_list, test_list
        self.train_images, self.train_depths = train_images, train_depths
        self.test_images, self.test_depths = test_images, test_depths
        self.depth_scale = depth_scale
        self.crop_size = (int(crop_size[0]), int(crop_size[1]))
        self.rotate, self.brightness, self.gamma, self.colour = rotate, tuple(brightness), tuple(gamma), tuple(colour)
        self.eval_short_side = eval_short_side
        self.crop_kb = crop_kb

    @property
    def train_location(self) -> str:
        return str(self.root / self.train_list)

    def annotation_path(self, split: str) -> Path:
        """The split file of "train" or "val" (= test: the benchmarks validate on it)."""
        return self.root / (self.train_list if split == "train" else self.test_list)

    def check_root(self) -> None:
        if not self.root.is_dir():
            raise FileNotFoundError(f"{self.root}: no such directory; {self.layout_help}")

    def train_transforms(self) -> A.Compose:
        transform = depth_train_transforms(
            self.crop_size, self.mean, self.std, self.rotate, self.brightness, self.gamma, self.colour
        )
        return self.seeded(transform)

    def _split(self, split: str, transform: Callable[..., Any]) -> DepthFilesDataset:
        images, depths = (
            (self.train_images, self.train_depths) if split == "train" else (self.test_images, self.test_depths)
        )
        # on_bad_sample reaches the split here: what is missing or malformed is known before any sample is read
        entries = read_split_file(self.annotation_path(split), self.on_bad_sample)
        return DepthFilesDataset(
            self.root / images,
            self.root / depths,
            entries,
            transform,
            self.depth_scale,
            crop_kb=self.crop_kb,
            on_bad_sample=self.on_bad_sample,
        )

    def setup_splits(self, stage: str) -> None:
        self.check_root()
        evaluation = DepthEvalTransform(self.preprocess())
        if stage == "fit":
            self.train_dataset = self._split("train", self.train_transforms())
        if stage in ("fit", "validate", "test", "predict"):
            self.val_dataset = self.test_dataset = self.predict_dataset = self._split("val", evaluation)

    def preprocess(self) -> Preprocess:
        if self.eval_short_side is None:
            return Preprocess("none", None, self.mean, self.std)
        return Preprocess("short_side", self.eval_short_side, self.mean, self.std)


class NYUDepthDataModule(DepthDataModule):
    """NYU Depth v2 as BTS and Depth Anything lay it out (`data_scripts/nyu_depth.py`):
    24231 training images from the raw scenes (`sync/`), Eigen's 654 test images
    (`official_splits/test/`), depth in mm; BTS's NYU augmentation (416 x 544 crops,
    ±2.5°, brightness 0.75-1.25). Evaluate with the task's `crop: eigen`, max depth 10."""

    layout_help = "run data_scripts/nyu_depth.py (sync/, official_splits/test/ and BTS's split files)"

    def __init__(
        self,
        *,
        root: str,
        train_list: str = "nyudepthv2_train_files_with_gt.txt",
        test_list: str = "nyudepthv2_test_files_with_gt.txt",
        train_images: str = "sync",
        train_depths: str = "sync",
        test_images: str = "official_splits/test",
        test_depths: str = "official_splits/test",
        crop_size: tuple[int, int] = (416, 544),
        img_size: int | None = None,
        rotate: float = 2.5,
        brightness: tuple[float, float] = (0.75, 1.25),
        eval_short_side: int | None = None,
        loader: LoaderConfig = DEPTH_LOADER,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        predict_dir: str | None = None,
    ) -> None:
        super().__init__(
            root=root,
            train_list=train_list,
            test_list=test_list,
            train_images=train_images,
            train_depths=train_depths,
            test_images=test_images,
            test_depths=test_depths,
            depth_scale=1000.0,
            crop_size=crop_size,
            img_size=img_size,
            rotate=rotate,
            brightness=brightness,
            eval_short_side=eval_short_side,
            loader=loader,
            backbone=backbone,
            mean=mean,
            std=std,
            predict_dir=predict_dir,
        )


class KITTIDepthDataModule(DepthDataModule):
    """KITTI's Eigen split as BTS lays it out (`data_scripts/kitti_depth.py`; `--test-only` for
    the test split's drives alone): raw images (the left colour camera, `image_02`) under
    `raw/`, the annotated depth (`data_depth_annotated`, value / 256 = m, its train/ and val/
    merged) under `data_depth_annotated/`, BTS's split files (lines without ground truth left
    out and counted); KITTI's benchmark crop of every image, BTS's KITTI augmentation (352 x
    704 crops, ±1°, brightness 0.9-1.1). Evaluate with the task's `crop: garg`, max depth 80."""

    layout_help = (
        "run data_scripts/kitti_depth.py (raw/ with KITTI's raw data, data_depth_annotated/ with KITTI's "
        "depth annotations, and BTS's eigen_*_files_with_gt.txt split files)"
    )

    def __init__(
        self,
        *,
        root: str,
        train_list: str = "eigen_train_files_with_gt.txt",
        test_list: str = "eigen_test_files_with_gt.txt",
        train_images: str = "raw",
        train_depths: str = "data_depth_annotated",
        test_images: str = "raw",
        test_depths: str = "data_depth_annotated",
        crop_size: tuple[int, int] = (352, 704),
        img_size: int | None = None,
        rotate: float = 1.0,
        brightness: tuple[float, float] = (0.9, 1.1),
        eval_short_side: int | None = None,
        loader: LoaderConfig = DEPTH_LOADER,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        predict_dir: str | None = None,
    ) -> None:
        super().__init__(
            root=root,
            train_list=train_list,
            test_list=test_list,
            train_images=train_images,
            train_depths=train_depths,
            test_images=test_images,
            test_depths=test_depths,
            depth_scale=256.0,
            crop_size=crop_size,
            img_size=img_size,
            rotate=rotate,
            brightness=brightness,
            eval_short_side=eval_short_side,
            crop_kb=True,
            loader=loader,
            backbone=backbone,
            mean=mean,
            std=std,
            predict_dir=predict_dir,
        )
