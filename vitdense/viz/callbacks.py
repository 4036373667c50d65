"""What training shows besides its scalars: pictures of fixed validation images with their
predictions every validation epoch, and the training throughput in images per second.

vitdense's `Trainer` adds both (and Lightning's `LearningRateMonitor`) to every `fit` that
has a logger, unless the trainer already has a callback of the same kind: configure one in
`trainer.callbacks` to change its settings (`ValidationImages` with `num_images: 0` turns
the pictures off).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.loggers.logger import DummyLogger
from lightning.pytorch.utilities import move_data_to_device, rank_zero_warn
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from vitdense.core.draw import denormalize
from vitdense.core.preprocess import LabelInfo


def log_images(trainer: L.Trainer, tag: str, images: list[np.ndarray], step: int) -> list[Path]:
    """Hand pictures ([H, W, 3] uint8) to every logger of the trainer: TensorBoard's
    `add_image` (as `<tag>/<i>`), a logger's own `log_image` (Weights & Biases, Neptune),
    else PNG files under the logger's folder (`<log_dir>/images/`). Returns the files written."""
    written = []
    for logger in trainer.loggers:
        if isinstance(logger, DummyLogger):  # fast_dev_run and friends
            continue
        if isinstance(logger, TensorBoardLogger):
            for i, image in enumerate(images):
                logger.experiment.add_image(f"{tag}/{i}", image, step, dataformats="HWC")
        elif callable(getattr(logger, "log_image", None)):
            logger.log_image(key=tag, images=list(images), step=step)
        else:
            folder = Path(getattr(logger, "log_dir", None) or trainer.default_root_dir) / "images"
            folder.mkdir(parents=True, exist_ok=True)
            for i, image in enumerate(images):
                path = folder / f"{tag.replace('/', '_')}_{i}_step{step:07d}.png"
                Image.fromarray(image).save(path)
                written.append(path)
    return written


class ValidationImages(L.Callback):
    """Log pictures of the same validation images with the model's predictions at the end
    of every `every_n_epochs`-th validation: ground truth beside prediction (segmentation
    overlays with a legend, detection boxes with class names and scores, a classification
    grid with true and predicted labels). The task draws them (`BaseTask.draw_batch`).

    The images are `num_images` samples spread evenly over the validation set (the first,
    the last and those between), chosen once, so epochs compare like with like. Only the
    first process draws; the sanity check draws nothing.

    Args:
        num_images: how many validation images (0: none).
        every_n_epochs: draw at every n-th validation.
        tag: the logger's name for the pictures.
    """

    def __init__(self, num_images: int = 8, every_n_epochs: int = 1, tag: str = "val/images") -> None:
        if num_images < 0 or every_n_epochs < 1:
            raise ValueError(
                f"ValidationImages: num_images={num_images} (>= 0), every_n_epochs={every_n_epochs} (>= 1)"
            )
        self.num_images = num_images
        self.every_n_epochs = every_n_epochs
        self.tag = tag
        self._batches: dict[str | None, Any] = {}
        self._validations = 0

    def select(self, dataset: Any) -> list[int]:
        """Indices of the samples to draw: spread evenly over `dataset`."""
        count = min(self.num_images, len(dataset))
        return sorted({int(i) for i in np.linspace(0, len(dataset) - 1, count).round()}) if count else []

    def batch(self, trainer: L.Trainer, key: str | None = None) -> Any:
        """The chosen samples collated as the validation loader collates them (built once;
        `key`: a multi-task model's task, whose loader it is)."""
        if key not in self._batches:
            loader = trainer.val_dataloaders
            loader = loader[0] if isinstance(loader, list | tuple) else loader
            samples = [loader.dataset[i] for i in self.select(loader.dataset)]
            samples = [s for s in samples if s is not None]  # unreadable ones, skipped under on_bad_sample=skip
            self._batches[key] = loader.collate_fn(samples) if samples else None
        return self._batches[key]

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or not self.num_images:
            return
        self._validations += 1
        if (self._validations - 1) % self.every_n_epochs or not trainer.is_global_zero:
            return
        if not any(not isinstance(logger, DummyLogger) for logger in trainer.loggers):
            return
        parts = getattr(pl_module, "drawn_parts", None)
        if parts is None:
            self.draw(trainer, pl_module, pl_module.device, self.tag)
            return
        # a module of several tasks (`MultiTask`): each draws its own images, under its own tag
        for view, task, tag, key in parts(trainer, self.tag):
            self.draw(view, task, pl_module.device, tag, key)

    def draw(self, trainer: Any, task: Any, device: torch.device, tag: str, key: str | None = None) -> None:
        """Log `task`'s pictures of its chosen validation images under `tag`."""
        draw = getattr(task, "draw_batch", None)
        if draw is None:
            rank_zero_warn(f"ValidationImages: {type(task).__name__} has no draw_batch; nothing to log")
            self.num_images = 0
            return
        batch = self.batch(trainer, key)
        if batch is None:
            return
        batch = move_data_to_device(batch, device)
        datamodule = trainer.datamodule
        cfg = getattr(getattr(task, "backbone", None), "pretrained_cfg", None) or {}
        mean = getattr(datamodule, "mean", None) or cfg.get("mean", IMAGENET_DEFAULT_MEAN)
        std = getattr(datamodule, "std", None) or cfg.get("std", IMAGENET_DEFAULT_STD)
        pixels = denormalize(batch.image, batch.image_sizes.sizes, mean, std)
        palette = LabelInfo.of(datamodule).colours(task.num_classes)
        with torch.no_grad(), trainer.precision_plugin.val_step_context():
            images = draw(batch, pixels, palette)
        log_images(trainer, tag, images, trainer.global_step)

    def state_dict(self) -> dict[str, Any]:
        return {"validations": self._validations}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._validations = state_dict.get("validations", 0)


def batch_size(batch: Any) -> int:
    """Images in a batch (vitdense's batches have `image` [B, 3, H, W]); of a multi-task
    step's {name: batch}, the distinct ones (tasks labelling the same images count them once)."""
    if isinstance(batch, Mapping):
        seen: list[torch.Tensor] = []
        for part in batch.values():
            image = getattr(part, "image", None)
            if image is not None and not any(x.shape == image.shape and torch.equal(x, image) for x in seen):
                seen.append(image)
        return sum(int(x.shape[0]) for x in seen)
    return int(batch.image.shape[0]) if hasattr(batch, "image") else 0


class ImagesPerSecond(L.Callback):
    """Log `train/images_per_sec`: images trained per second, summed over processes, over
    the last `every_n_steps` batches (data loading included; reset at each epoch start), and
    `train/data_wait`: the fraction of that time spent between one batch's end and the next
    one's start — waiting for the loader (and Lightning's bookkeeping), averaged over
    processes. Near 0 the model sets the pace; well above it, more loader workers would
    help. (On a GPU the step's kernels run asynchronously, so a step that has not finished
    may be counted as waiting for the next batch.)

    Lightning's `ThroughputMonitor` does this and more (FLOPs, MFU), but logs five series
    per step and synchronises the GPU after every batch; this logs two figures at Lightning's
    logging interval, with no synchronisation but the reduction over processes.

    Args:
        every_n_steps: batches per figure (None: the trainer's `log_every_n_steps`).
    """

    def __init__(self, every_n_steps: int | None = None) -> None:
        self.every_n_steps = every_n_steps
        self._start: float | None = None
        self._last_end: float | None = None
        self._images = 0
        self._batches = 0
        self._waiting = 0.0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = self._last_end = None

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        if self._start is None:
            self._start, self._images, self._batches, self._waiting = now, 0, 0, 0.0
        elif self._last_end is not None:
            self._waiting += now - self._last_end

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if batch is None or self._start is None:
            return
        now = self._last_end = time.perf_counter()
        self._images += batch_size(batch)
        self._batches += 1
        if self._batches >= (self.every_n_steps or trainer.log_every_n_steps):
            elapsed = max(now - self._start, 1e-9)
            log = dict(on_step=True, on_epoch=False, sync_dist=True)
            pl_module.log("train/images_per_sec", self._images / elapsed, reduce_fx="sum", **log)
            pl_module.log("train/data_wait", self._waiting / elapsed, reduce_fx="mean", **log)
            # the next window starts now, so it counts the loading of its first batch too
            self._start, self._images, self._batches, self._waiting = now, 0, 0, 0.0
