"""Fashion-MNIST (Xiao et al. 2017) offline, from the IDX files Debian's package
`dataset-fashion-mnist` installs: labelled for classification, and its training images
without labels for pre-training (MAE, masked patch prediction, distillation).

The package puts the four official files, gzipped, in `/usr/share/datasets/fashion-mnist`:
`train-images-idx3-ubyte.gz`, `train-labels-idx1-ubyte.gz`, `t10k-images-idx3-ubyte.gz`,
`t10k-labels-idx1-ubyte.gz` (60,000 training and 10,000 test images, 28x28 grayscale, ten
classes). Any folder holding those four names, gzipped or not (torchvision's `raw/` folder
too), works as `root`. The 28x28 images are replicated to three channels and resized to the
ViT's input size, as CIFAR's are (`cifar.py`).
"""

from __future__ import annotations

import gzip
import logging
import zlib
from pathlib import Path

import numpy as np

from vitdense.core.errors import DataError
from vitdense.data.base import LoaderConfig, Triple
from vitdense.data.cifar import CIFARImages
from vitdense.data.classification import ClassificationDataModule, check_val_fraction, held_out_split
from vitdense.data.transforms.classification import classification_train_transforms
from vitdense.types import LabeledImages

_logger = logging.getLogger(__name__)

#: where Debian's `dataset-fashion-mnist` installs the four files
FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"

#: the label names of the dataset's README (label 0 to 9), as torchvision's `FashionMNIST.classes`
FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip

#: IDX magic numbers: 0x00000803 (unsigned bytes, 3 dimensions) and 0x00000801 (unsigned bytes, 1 dimension)
IMAGES_MAGIC, LABELS_MAGIC = 2051, 2049

#: {split: (image file, label file)}, without the optional ".gz"
FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

_KIND = {IMAGES_MAGIC: "an IDX image file", LABELS_MAGIC: "an IDX label file"}


def _install_hint(root: Path) -> str:
    files = ", ".join(f"{name}[.gz]" for pair in FASHION_MNIST_FILES.values() for name in pair)
    return (
        f"install Debian's package (`apt-get install dataset-fashion-mnist`, which puts them in {FASHION_MNIST_ROOT}), "
        f"or set data.init_args.root to a folder holding the four files {files} (now {root})"
    )


def read_idx(path: str | Path, magic: int) -> np.ndarray:
    """The uint8 array of an IDX file (LeCun's MNIST format), gzipped or not.

    The header is big-endian: a 4-byte magic number (0, 0, type 0x08 = unsigned byte,
    number of dimensions) then one 4-byte size per dimension; the values follow, row-major.

    Args:
        path: the file; gzip is recognised by its content, not its name.
        magic: the magic number expected (`IMAGES_MAGIC`: [N, H, W], `LABELS_MAGIC`: [N]).

    Returns:
        [N, H, W] or [N] uint8, read-only (a view of the file's bytes).

    Raises:
        DataError: the file cannot be read, is not readable gzip, has another magic number, or is shorter
            or longer than its header says; the message names the file.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:  # a folder of that name, no permission
        raise DataError(f"{path}: cannot be read ({err.strerror})") from err
    if data[:2] == b"\x1f\x8b":  # gzip's own magic
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as err:  # BadGzipFile is an OSError; EOFError: cut short
            raise DataError(f"{path}: a damaged or truncated gzip file ({err}); reinstall or re-copy it") from err
    if len(data) < 4:
        raise DataError(f"{path}: truncated ({len(data)} bytes, not even the 4-byte IDX magic number)")
    found = int.from_bytes(data[:4], "big")
    if found != magic:
        what = _KIND.get(found, "not an IDX file of unsigned bytes")
        raise DataError(
            f"{path}: magic number {found} ({what}), expected {magic} ({_KIND[magic]}); "
            "check that the file names were not swapped"
        )
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{path}: truncated inside its {header}-byte header ({len(data)} bytes)")
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected, body = int(np.prod(shape)), len(data) - header
    if body != expected:
        state = "truncated" if body < expected else "longer than its header says"
        raise DataError(
            f"{path}: {state}: the header says shape {list(shape)} ({expected} bytes of values) but {body} bytes "
            "follow it; the file is damaged, reinstall or re-copy it"
        )
    return np.frombuffer(data, dtype=np.uint8, count=expected, offset=header).reshape(shape)


def find_idx(root: Path, name: str) -> Path:
    """`root / name`, or `root / name.gz`; an error naming the folder and the fix when neither is there."""
    if not root.is_dir():
        raise DataError(f"{root}: no such folder; Fashion-MNIST was looked for there: {_install_hint(root)}")
    for candidate in (root / name, root / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise DataError(f"{root / name}[.gz]: missing from {root}; {_install_hint(root)}")


def load_fashion_mnist(
    root: str | Path, split: str, labels: bool = True, num_classes: int = len(FASHION_MNIST_CLASSES)
) -> tuple[np.ndarray, np.ndarray | None]:
    """([N, 28, 28] uint8 images, [N] int64 labels or None) of the "train" or "test" split
    under `root`; with `labels=False` the label file is not opened at all."""
    root = Path(root)
    image_name, label_name = FASHION_MNIST_FILES[split]
    image_path = find_idx(root, image_name)
    images = read_idx(image_path, IMAGES_MAGIC)
    if not labels:
        return images, None
    label_path = find_idx(root, label_name)
    targets = read_idx(label_path, LABELS_MAGIC).astype(np.int64)
    if len(targets) != len(images):
        raise DataError(
            f"{label_path}: {len(targets)} labels but {image_path} holds {len(images)} images; "
            "the two files of a split must come from the same release"
        )
    if len(targets) and targets.max() >= num_classes:
        raise DataError(
            f"{label_path}: label {targets.max()} is out of range (Fashion-MNIST has {num_classes} classes)"
        )
    return images, targets


class FashionMNISTImages(CIFARImages):
    """Grayscale images held in memory, as `LabeledImages` with three equal channels
    (`CIFARImages`' arguments, with images [N, H, W] uint8 and labels None for unlabelled
    images: label -1)."""

    def __getitem__(self, index: int) -> LabeledImages:
        i = self.indices[index]
        # replicated per sample, not up front: the array stays a third of the size
        rgb = np.repeat(self.images[i][:, :, None], 3, axis=2)
        label = -1 if self.labels is None else int(self.labels[i])
        return LabeledImages(self.transform(image=rgb)["image"], label, index)


FASHION_MNIST_LOADER = LoaderConfig(batch_size=64)


class _FashionMNISTFiles:
    """The splits of one `root`, each read once per DataModule (fit then test reuse them)."""

    root: Path
    _arrays: dict[tuple[str, bool], tuple[np.ndarray, np.ndarray | None]]

    def _split(self, split: str, labels: bool) -> tuple[np.ndarray, np.ndarray | None]:
        if (split, labels) not in self._arrays:
            self._arrays[split, labels] = load_fashion_mnist(self.root, split, labels)
        return self._arrays[split, labels]

    @property
    def train_location(self) -> str:
        return str(self.root / FASHION_MNIST_FILES["train"][0])


class FashionMNISTDataModule(_FashionMNISTFiles, ClassificationDataModule):
    """Fashion-MNIST classification from its IDX files under `root` (default: where Debian's
    `dataset-fashion-mnist` installs them).

    Splits follow torchvision's `FashionMNIST(train=True / False)`: training on the 60,000
    training images, test (and predict, in order) on the official 10,000 test images.
    Validation uses the test set too, as the dataset's benchmark and CIFARDataModule do,
    unless `val_fraction` holds out a seeded part of the training set instead (e.g.
    1/12: 5,000 images, for choosing settings without looking at the test set).

    The 28x28 grayscale images become three equal channels, resized to `img_size` through
    the project's classification pipelines (random resized crop and flip for training; the
    whole image resized for evaluation). `num_classes` (10) and `class_names` are known on
    construction, before anything is read.

        data:
          class_path: vitdense.data.FashionMNISTDataModule
          init_args: {img_size: 32, val_fraction: 0.0833}

    Args:
        root: folder of the four IDX files (gzipped or not).
        img_size: side the images are resized to.
        val_fraction: share of the training set held out for validation (0: validate on
            the test set).
        seed: seed of the held-out share.
        scale: area range of the training random resized crop.
        color_jitter: training brightness/contrast jitter strength (0, the default, disables it).
        loader, backbone, mean, std, predict_dir: see `ImageDataModule`. The default
            normalisation is ImageNet's (or the backbone's); Fashion-MNIST's own is
            `mean: [0.286, 0.286, 0.286], std: [0.353, 0.353, 0.353]`.
    """

    def __init__(
        self,
        *,
        root: str = FASHION_MNIST_ROOT,
        img_size: int = 224,
        val_fraction: float = 0.0,
        seed: int = 0,
        scale: tuple[float, float] = (0.08, 1.0),
        color_jitter: float = 0.0,
        loader: LoaderConfig = FASHION_MNIST_LOADER,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        predict_dir: str | None = None,
    ) -> None:
        super().__init__(
            img_size=img_size, loader=loader, backbone=backbone, mean=mean, std=std, predict_dir=predict_dir
        )
        check_val_fraction(val_fraction)
        self.root, self._arrays = Path(root), {}
        self.val_fraction, self.seed = val_fraction, seed
        self.scale, self.color_jitter = tuple(scale), color_jitter
        self.class_names = list(FASHION_MNIST_CLASSES)
        self.num_classes = len(FASHION_MNIST_CLASSES)

    def setup_splits(self, stage: str) -> None:
        eval_transform = self.eval_transforms()
        if stage in ("fit", "validate"):
            if self.val_fraction > 0:
                images, labels = self._split("train", labels=True)
                train_idx, val_idx = held_out_split(len(images), self.val_fraction, self.seed)
                self.val_dataset = FashionMNISTImages(images, labels, eval_transform, val_idx)
            else:
                self.val_dataset = FashionMNISTImages(*self._split("test", labels=True), eval_transform)
            if stage == "fit":
                train_transform = self.train_transforms(self.scale, self.color_jitter)
                if self.val_fraction > 0:
                    self.train_dataset = FashionMNISTImages(images, labels, train_transform, train_idx)
                else:
                    self.train_dataset = FashionMNISTImages(*self._split("train", labels=True), train_transform)
            _logger.info(
                "Fashion-MNIST: %d validation images (%s)",
                len(self.val_dataset),
                f"{self.val_fraction:.1%} of train, seed {self.seed}" if self.val_fraction > 0 else "the test set",
            )
        if stage in ("test", "predict"):
            test = FashionMNISTImages(*self._split("test", labels=True), eval_transform)
            self.test_dataset = self.predict_dataset = test


class FashionMNISTUnlabeledDataModule(_FashionMNISTFiles, ClassificationDataModule):
    """Fashion-MNIST's training images without labels, for self-supervised pre-training
    (`MaskedImageModelingTask`, as `UnlabeledImagesDataModule` feeds it): the label files
    are never opened, samples are `LabeledImages` with label -1, and `num_classes` /
    `class_names` are None.

    Validation (and test) images are a seeded `val_fraction` of the training images held
    out, so that pre-training never sees the test set; `val_fraction=0` validates on the
    test split's images instead (still without labels). Training augmentation is MAE's, as
    `UnlabeledImagesDataModule`'s: RandomResizedCrop to `img_size` (area `scale`, bicubic)
    and a horizontal flip, no colour jitter.

        data:
          class_path: vitdense.data.FashionMNISTUnlabeledDataModule
          init_args: {img_size: 32}

    Args:
        root: folder of the IDX files (only the image files are read).
        img_size: side of the square training crops.
        val_fraction: share of the training images held out for validation (0: the test images).
        seed: seed of the held-out share.
        scale: area range of the random resized crop (MAE: 0.2 to 1).
        hflip: probability of a horizontal flip.
        loader, backbone, mean, std, predict_dir: see `ImageDataModule`.
    """

    num_classes = None
    class_names = None

    def __init__(
        self,
        *,
        root: str = FASHION_MNIST_ROOT,
        img_size: int = 224,
        val_fraction: float = 0.01,
        seed: int = 0,
        scale: tuple[float, float] = (0.2, 1.0),
        hflip: float = 0.5,
        loader: LoaderConfig = FASHION_MNIST_LOADER,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        predict_dir: str | None = None,
    ) -> None:
        super().__init__(
            img_size=img_size, loader=loader, backbone=backbone, mean=mean, std=std, predict_dir=predict_dir
        )
        check_val_fraction(val_fraction)
        self.root, self._arrays = Path(root), {}
        self.val_fraction, self.seed = val_fraction, seed
        self.scale, self.hflip = tuple(scale), hflip

    def setup_splits(self, stage: str) -> None:
        eval_tf = self.eval_transforms()
        images, _ = self._split("train", labels=False)
        if self.val_fraction > 0:
            train_idx, val_idx = held_out_split(len(images), self.val_fraction, self.seed)
            self.val_dataset = FashionMNISTImages(images, None, eval_tf, val_idx)
        else:
            train_idx = None
            self.val_dataset = FashionMNISTImages(self._split("test", labels=False)[0], None, eval_tf)
        self.test_dataset = self.val_dataset
        if stage == "fit":
            train_tf = self.seeded(
                classification_train_transforms(
                    self.img_size, self.mean, self.std, self.scale, hflip=self.hflip, color_jitter=0.0
                )
            )
            self.train_dataset = FashionMNISTImages(images, None, train_tf, train_idx)
