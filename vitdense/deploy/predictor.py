"""`vitdense.load("run.ckpt")`: a trained checkpoint as a function from images to results.

    predictor = vitdense.load("runs/demo_seg/checkpoints/last.ckpt")
    result = predictor("photo.jpg")            # one image -> one result
    results = predictor(["a.jpg", pil, array])  # several (or a folder) -> a list, in order

The predictor carries what the checkpoint was trained with: the evaluation preprocessing
and label facts its DataModule recorded (`vitdense.core.preprocess`: resize rule, crop,
mean/std, palette, category ids; the DataModule itself is neither imported nor rebuilt),
the task's own inference (segmentation's sliding windows and test-time augmentation,
detection's post-processing) and the class names. It runs the task's `predict_step` on
batches padded as the DataLoader pads them and turns them into the task's results
(`task.to_results`, `vitdense.results`), so its numbers are those of `python -m vitdense
predict` on the same files, offline, without a config or a Trainer.

A built-in task's checkpoint records its plain model and how it predicts
(`vitdense.deploy.checkpoint.record_model`): the predictor then runs that model
(`PlainTask`) without importing the task class, Lightning, torchmetrics or scipy, so a new
process answers in little more time than importing torch and timm takes. A checkpoint
without the record (written before it, or by a task of your own) restores its task through
Lightning and runs the task's own hooks.

Images may be file paths (a folder: every image in it, as `--data.predict_dir` reads
it), PIL images, NumPy arrays [H, W, 3] / [H, W] (uint8, uint16, or float in [0, 1]) and
tensors [3, H, W] / [B, 3, H, W] (uint8, or float in [0, 1], torchvision's convention).
Files and PIL images are turned upright by their EXIF orientation and 16-bit pixels are
scaled to 8 bits, as the command line reads them.

Large images with small objects (detection, instance segmentation) can be predicted in
overlapping tiles, merged as SAHI merges them (`vitdense.deploy.slicing`):

    predictor = vitdense.load("det.ckpt", slicing=Slicing(slice_height=64, overlap_height_ratio=0.2))
    result = predictor("aerial.png")           # tiles + the whole image, merged; boxes in the image's frame
    predictor.slicing = None                    # (whole images again)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from vitdense.core.errors import ConfigError, DataError
from vitdense.core.images import apply_orientation, decode_image, find_images, orientation, to_rgb8
from vitdense.core.precision import resolve_precision
from vitdense.core.preprocess import InferenceData, PredictSample
from vitdense.deploy.checkpoint import Checkpoint, locate
from vitdense.deploy.slicing import SlicedImage, Slicing, check_checkpoint_sliceable, check_sliceable
from vitdense.results.common import Result, ResultContext
from vitdense.types.collate import pad_collate

#: what a predictor takes as one image
ImageInput = str | Path | Image.Image | np.ndarray | torch.Tensor


def to_pixels(image: np.ndarray | torch.Tensor | Image.Image) -> np.ndarray:
    """An in-memory image as upright [H, W, 3] uint8 RGB, the pixels the DataModule's
    evaluation transform takes.

    PIL images: EXIF orientation applied, high bit depths scaled (as files are read).
    Arrays [H, W, C] (C 1, 3 or 4: alpha dropped) or [H, W]; tensors [C, H, W] or [H, W].
    uint8 as is; uint16 scaled by 255 / 65535; float values in [0, 1] scaled by 255.

    Raises:
        DataError: a shape, channel count, dtype or value range that is not an image.
    """
    if isinstance(image, Image.Image):
        return apply_orientation(to_rgb8(image), orientation(image))
    if isinstance(image, torch.Tensor):
        if image.ndim == 3:
            image = image.permute(1, 2, 0)  # CHW (torchvision) -> HWC
        image = image.detach().cpu().numpy()
    array = np.asarray(image)
    if array.ndim == 2:
        array = array[..., None]
    if array.ndim != 3 or array.shape[-1] not in (1, 3, 4) or 0 in array.shape:
        raise DataError(
            f"an image array of shape {tuple(np.shape(image))}: expected [H, W, 3] (RGB), [H, W] (grey) or "
            "[H, W, 4] (RGBA); a tensor: [3, H, W]"
        )
    array = array[..., :3] if array.shape[-1] == 4 else array
    if array.dtype == np.uint8:
        pixels = array
    elif array.dtype == np.uint16:
        pixels = np.rint(array.astype(np.float64) * (255 / 65535)).astype(np.uint8)
    elif np.issubdtype(array.dtype, np.floating):
        low, high = float(np.nanmin(array)), float(np.nanmax(array))
        if not (np.isfinite(array).all() and low >= 0 and high <= 1):
            raise DataError(
                f"a float image with values in [{low:g}, {high:g}]: float pixels must lie in [0, 1]; "
                "pass uint8 for 0..255"
            )
        pixels = np.rint(array * 255).astype(np.uint8)
    else:
        raise DataError(f"an image array of dtype {array.dtype}: expected uint8, uint16 or float in [0, 1]")
    if pixels.shape[-1] == 1:
        pixels = np.repeat(pixels, 3, axis=-1)
    return np.ascontiguousarray(pixels)


def inference_data(found: Checkpoint) -> InferenceData:
    """The preprocessing and label facts a checkpoint recorded; for a checkpoint written
    before they were recorded, those of its DataModule, rebuilt from its hyperparameters
    (which imports it: the one case that does)."""
    if found.inference is not None:
        return InferenceData.from_data(found.inference)
    made = InferenceData.of(rebuild_datamodule(found))
    if made is None:
        raise ConfigError(
            f"ckpt_path {found.path}: its DataModule {found.data_class} declares no preprocess(), so the images' "
            "preprocessing is unknown; build the Predictor yourself: Predictor(task, InferenceData(Preprocess(...)))"
        )
    return made


def rebuild_datamodule(found: Checkpoint) -> Any:
    """The DataModule a checkpoint was trained with, rebuilt from its hyperparameters (its
    normalisation, sizes and classes; the dataset itself need not be present)."""
    if found.data_class is None:
        raise ConfigError(
            f"ckpt_path {found.path}: no DataModule recorded, so the images' preprocessing is unknown; "
            "build the Predictor yourself: Predictor(task, InferenceData(Preprocess(...)))"
        )
    # (the DataModule takes its recorded loader settings as the plain dict they are)
    return locate(found.data_class)(**{**found.data, "predict_dir": None})


def eval_batch_size(found: Checkpoint) -> int | None:
    """The evaluation batch the checkpoint's data loaded with, if it says."""
    loader = found.data.get("loader")
    if isinstance(loader, dict):
        return loader.get("eval_batch_size") or loader.get("batch_size")
    return getattr(loader, "eval_batch_size", None) or getattr(loader, "batch_size", None)


class Predictor:
    """A trained task and its evaluation preprocessing, as a function from images to typed
    results (see the module docstring for what it takes).

    Args:
        task: the trained task (in evaluation mode; moved to `device`), or a checkpoint's
            `PlainTask` (its plain model and recorded inference: the same hooks).
        data: what the images go through and how labels are shown: `InferenceData`
            (`vitdense.core.preprocess`), or a DataModule that declares `preprocess()`.
        device: where the model runs ("cpu", "cuda", "cuda:1", ...).
        batch_size: images run at once (default: 8, or the DataModule's evaluation batch).
        precision: "32-true" (what `python -m vitdense predict` runs from a checkpoint),
            "bf16-mixed" (autocast), or "auto" (bf16 where the device computes it natively).
        slicing: predict each image in overlapping tiles, merged (`vitdense.deploy.slicing.Slicing`;
            detection and instance segmentation); None: whole images. An attribute: set it
            (or None) between calls.
    """

    def __init__(
        self,
        task: Any,
        data: InferenceData | Any,
        *,
        device: str | torch.device = "cpu",
        batch_size: int | None = None,
        precision: str = "32-true",
        slicing: Slicing | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.task = task.to(self.device).eval()
        if not isinstance(data, InferenceData):
            loader = getattr(data, "loader", None)
            batch_size = batch_size or (loader.eval_batch_size or loader.batch_size if loader else None)
            made = InferenceData.of(data)
            if made is None:
                raise ConfigError(
                    f"{type(data).__name__} declares no preprocess(): pass InferenceData(Preprocess(...))"
                )
            data = made
        self.data = data
        self.batch_size = batch_size or 8
        self.precision = str(resolve_precision(precision, self.device.type).precision)
        self.slicing = slicing

    @property
    def slicing(self) -> Slicing | None:
        return self._slicing

    @slicing.setter
    def slicing(self, slicing: Slicing | None) -> None:
        if slicing is not None:
            check_sliceable(self.task)  # (a task without objects: refused now, not at the first image)
        self._slicing = slicing

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        *,
        device: str | torch.device = "cpu",
        batch_size: int | None = None,
        precision: str = "32-true",
        slicing: Slicing | None = None,
    ) -> Predictor:
        """The predictor of a vitdense training checkpoint (`python -m vitdense fit`, or a
        task fitted from Python): its model and inference (`Checkpoint.for_inference`: the
        plain model where the checkpoint records it, else the task through Lightning),
        weights, preprocessing and class names."""
        found = path if isinstance(path, Checkpoint) else Checkpoint(path)
        if slicing is not None:  # (a task without objects: refused before its weights load)
            check_checkpoint_sliceable(found)
        task = found.for_inference("cpu")
        data = inference_data(found)
        batch_size = batch_size or eval_batch_size(found)
        return cls(task, data, device=device, batch_size=batch_size, precision=precision, slicing=slicing)

    @property
    def class_names(self) -> list[str]:
        names = getattr(self.task, "class_names", None)
        return list(names) if names else [str(k) for k in range(self.task.num_classes)]

    def __call__(self, images: ImageInput | Sequence[ImageInput]) -> Result | list[Result]:
        """Results of one image (a result) or several (a list in the same order; a folder
        counts as several, in `find_images`' order)."""
        single = is_one_image(images)
        loaded = list(self.load_images(images if isinstance(images, (list, tuple)) else [images]))
        results = []
        for start in range(0, len(loaded), self.batch_size):
            results += self.predict_batch(loaded[start : start + self.batch_size])
        return results[0] if single else results

    def load_images(self, images: Sequence[ImageInput]) -> Iterator[tuple[np.ndarray, str | None]]:
        """(upright [H, W, 3] uint8 pixels, source file or None) of each image, folders expanded."""
        for image in images:
            if isinstance(image, (str, Path)):
                paths = find_images(image) if Path(image).is_dir() else [Path(image)]
                for path in paths:
                    if not path.is_file():
                        raise FileNotFoundError(f"{path}: no such image file")
                    yield decode_image(path), str(path)
            elif _is_batch(image):
                yield from ((to_pixels(x), None) for x in image)
            else:
                yield to_pixels(image), None

    def sample(self, pixels: np.ndarray, index: int) -> Any:
        """The task's sample of one image ([H, W, 3] uint8), preprocessed."""
        return PredictSample(self.task.predict_sample, self.data.preprocess)(pixels, index)

    @torch.inference_mode()
    def predict_batch(self, images: Sequence[tuple[np.ndarray, str | None]]) -> list[Result]:
        """Results of a list of (pixels, source) run as one padded batch (with `slicing`: each
        image's tiles in batches of `slicing.batch_size`)."""
        if self.slicing is not None:
            batch = pad_collate(
                [SlicedImage(pixels, i, self.sample, self.slicing) for i, (pixels, _) in enumerate(images)]
            )
        else:
            batch = pad_collate([self.sample(pixels, i) for i, (pixels, _) in enumerate(images)])
        batch = self.task.transfer_batch_to_device(batch, self.device, 0)
        with self._autocast():
            prediction = self.task.predict_step(batch, 0)
        context = ResultContext(
            class_names=self.class_names,
            labels=self.data.labels,
            sizes=[tuple(pixels.shape[:2]) for pixels, _ in images],
            sources=[source for _, source in images],
        )
        return self.task.to_results(prediction, context)

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.precision in ("bf16-mixed", "bf16"):
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        if self.precision in ("16-mixed", "16"):
            return torch.autocast(self.device.type, dtype=torch.float16)
        return contextlib.nullcontext()


def is_one_image(images: Any) -> bool:
    """Whether a predictor's input is one image (one result), not a list, a folder or a
    batch tensor [B, 3, H, W] (a list of results)."""
    return not isinstance(images, (list, tuple)) and not _is_folder(images) and not _is_batch(images)


def _is_folder(image: Any) -> bool:
    return isinstance(image, (str, Path)) and Path(image).is_dir()


def _is_batch(image: Any) -> bool:
    """A tensor [B, 3, H, W] of several images."""
    return isinstance(image, torch.Tensor) and image.ndim == 4


def load(
    path: str | Path,
    *,
    device: str | torch.device = "cpu",
    batch_size: int | None = None,
    precision: str = "32-true",
    slicing: Slicing | None = None,
) -> Predictor | Any:
    """The `Predictor` of a vitdense training checkpoint (see `Predictor.from_checkpoint`;
    `slicing`: predict in tiles, `vitdense.deploy.slicing`); for a multi-task checkpoint
    (`vitdense.tasks.MultiTask`) a `MultiTaskPredictor`: {name: result} per image."""
    found = Checkpoint(path)
    if found.is_multitask:
        from vitdense.deploy.multitask import MultiTaskPredictor

        return MultiTaskPredictor.from_checkpoint(
            found, device=device, batch_size=batch_size, precision=precision, slicing=slicing
        )
    return Predictor.from_checkpoint(found, device=device, batch_size=batch_size, precision=precision, slicing=slicing)
