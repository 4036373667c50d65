"""Callbacks every task uses: writers of what tasks predict, the count of skipped samples,
and an EMA of the weights with a warmup.

They sit below the tasks (which hand them out) and import no task."""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import BasePredictionWriter, EMAWeightAveraging
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from PIL import Image

from vitdense.checkpoint import ResumeRNG
from vitdense.draw import blend, draw_boxes, palette_of

_logger = logging.getLogger(__name__)


def ema_warmup_update(
    averaged: torch.Tensor, current: torch.Tensor, num_averaged: torch.Tensor, decay: float, tau: float
) -> torch.Tensor:
    """One EMA step whose decay ramps up: the k-th update uses `decay * (1 - exp(-k / tau))`
    (the schedule of YOLOv5's and RF-DETR's `ModelEma`), so that the average soon leaves the
    early weights instead of carrying them for ~1 / (1 - decay) steps. `tau=0`: the constant
    `decay` (Lightning's `EMAWeightAveraging`). The first update is a copy (torch's
    `AveragedModel`), where `ModelEma` keeps 1% of the initial weights; every later one is
    the same. `num_averaged`: updates so far (k - 1)."""
    d = decay * (1 - torch.exp(-(num_averaged.to(averaged.dtype) + 1) / tau)) if tau > 0 else decay
    return averaged + (current - averaged) * (1 - d)


class WarmupEMAWeightAveraging(EMAWeightAveraging):
    """Lightning's `EMAWeightAveraging` with RF-DETR's decay warmup (`ema_warmup_update`):
    RF-DETR fine-tunes with `decay=0.993, warmup_tau=100`. Validation, test and the saved
    checkpoint's `state_dict` use the averaged weights; the current ones are kept in the
    checkpoint too, so a resumed run goes on with both (Lightning's behaviour).

    Args:
        decay: the EMA's decay once warmed up.
        warmup_tau: steps over which the decay ramps up (0: none).
        update_every_n_steps, update_starting_at_step, update_starting_at_epoch, device,
            use_buffers: as `EMAWeightAveraging`'s.
    """

    def __init__(
        self,
        decay: float = 0.993,
        warmup_tau: float = 100.0,
        update_every_n_steps: int = 1,
        update_starting_at_step: int | None = None,
        update_starting_at_epoch: int | None = None,
        device: str | None = None,
        use_buffers: bool = True,
    ) -> None:
        if not 0 <= decay < 1 or warmup_tau < 0:
            raise ValueError(f"decay={decay}, warmup_tau={warmup_tau}: expected 0 <= decay < 1 and warmup_tau >= 0")
        super().__init__(
            device=device,
            use_buffers=use_buffers,
            decay=decay,
            update_every_n_steps=update_every_n_steps,
            update_starting_at_step=update_starting_at_step,
            update_starting_at_epoch=update_starting_at_epoch,
        )
        # WeightAveraging hands its kwargs to torch's AveragedModel when training starts
        self._kwargs["avg_fn"] = partial(ema_warmup_update, decay=decay, tau=warmup_tau)


class SkippedSamples(L.Callback):
    """At each epoch end, warn how many bad samples the DataModule skipped (with
    `on_bad_sample: skip`; each was logged with its file when it was skipped) and log
    `{stage}/skipped_samples`, summed over processes. Every vitdense task adds it
    (`BaseTask.configure_callbacks`); a DataModule that does not skip is left alone."""

    def report(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        datamodule = getattr(trainer, "datamodule", None)
        if getattr(datamodule, "on_bad_sample", "raise") != "skip":
            return
        count = datamodule.take_skipped(stage)
        if count:
            rank = f" on rank {trainer.global_rank}" if trainer.world_size > 1 else ""
            _logger.warning("%s: skipped %d bad samples this epoch%s (files named above)", stage, count, rank)
        if stage != "predict":
            pl_module.log(f"{stage}/skipped_samples", float(count), reduce_fx="sum", sync_dist=True)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.report(trainer, pl_module, "train")

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.report(trainer, pl_module, "val")

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.report(trainer, pl_module, "test")

    def on_predict_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.report(trainer, pl_module, "predict")


class TopKPredictionWriter(BasePredictionWriter):
    """Write the top-k classes of every predicted image to a CSV file.

    One row per image: `index` (in its dataset), `path` (when the dataset has `samples`,
    as ImageFolder does), then `class_1, prob_1, ..., class_k, prob_k` with class names
    when the task has them. With several processes each writes `<stem>.rank<r>.csv`.

    Args:
        output_file: where to write (folders are created).
    """

    def __init__(self, output_file: str = "predictions.csv") -> None:
        super().__init__(write_interval="batch")
        self.output_file = Path(output_file)
        self._writer = None
        self._file = None

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = rank_path(self.output_file, trainer)
        self._file = path.open("w", newline="")
        self._writer = csv.writer(self._file)
        self.path = path

    def write_on_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        prediction: Any,
        batch_indices: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if prediction is None:  # a batch whose every image was skipped (on_bad_sample=skip)
            return
        names = getattr(pl_module, "class_names", None)
        dataset = predicted_dataset(trainer, dataloader_idx)
        k = prediction.classes.shape[1]
        if batch_idx == 0 and self._file.tell() == 0:
            header = ["index", "path"] + [f"{c}_{i}" for i in range(1, k + 1) for c in ("class", "prob")]
            self._writer.writerow(header)
        for index, probs, classes in zip(
            prediction.index.tolist(), prediction.probs.tolist(), prediction.classes.tolist(), strict=True
        ):
            path = sample_path(dataset, index) if index >= 0 else None
            row: list = [index, str(path or "")]
            for c, p in zip(classes, probs, strict=True):
                row += [names[c] if names else c, f"{p:.6f}"]
            self._writer.writerow(row)

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def rank_path(path: Path, trainer: L.Trainer) -> Path:
    """`path`, or `<stem>.rank<r><suffix>` beside it when several processes each write one;
    its folder is created."""
    if trainer.world_size > 1:
        path = path.with_name(f"{path.stem}.rank{trainer.global_rank}{path.suffix}")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def predicted_dataset(trainer: L.Trainer, dataloader_idx: int) -> Any:
    """The dataset behind the predict loader `dataloader_idx`."""
    loaders = trainer.predict_dataloaders
    return (loaders[dataloader_idx] if isinstance(loaders, list) else loaders).dataset


def output_name(dataset: Any, index: int) -> str:
    """The name (without suffix, maybe with sub-folders) of what is written for sample
    `index`: a folder's own relative names (`ImageFiles.output_names`), else the image's
    stem, else the index."""
    if getattr(dataset, "output_names", None) is not None:
        return dataset.output_names[index]
    path = sample_path(dataset, index)
    return path.stem if path is not None else f"{index:06d}"


def sample_path(dataset: Any, index: int) -> Path | None:
    """The image file behind sample `index`, when the dataset says (`image_paths` or `samples`)."""
    if getattr(dataset, "image_paths", None) is not None:
        return Path(dataset.image_paths[index])
    if getattr(dataset, "samples", None) is not None:
        return Path(dataset.samples[index][0])
    return None


class SegmentationPredictionWriter(BasePredictionWriter):
    """Write each predicted label map as a palette PNG at the image's original size, named
    after the image (`<stem>.png`, or the sample index), and optionally a colour overlay.

    The palette is the DataModule's `palette` ([K, 3]) when it has one, else a fixed random
    one. Pixel values follow the dataset's own files: class indices, plus 1 when the
    DataModule reduces label 0 (ADE20K stores classes as 1..150), so a prediction reads back
    like an annotation.

    Args:
        output_dir: folder for the PNGs (created).
        overlay: also write `<stem>_overlay.jpg`, the image blended with the coloured labels.
        alpha: weight of the colours in the overlay.
    """

    def __init__(self, output_dir: str = "predictions", overlay: bool = False, alpha: float = 0.5) -> None:
        super().__init__(write_interval="batch")
        self.output_dir = Path(output_dir)
        self.overlay = overlay
        self.alpha = alpha

    def write_on_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        prediction: Any,
        batch_indices: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if prediction is None:  # a batch whose every image was skipped (on_bad_sample=skip)
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        palette = palette_of(trainer.datamodule, pl_module.num_classes)
        dataset = predicted_dataset(trainer, dataloader_idx)
        for index, labels in zip(prediction.index.tolist(), prediction.labels, strict=True):
            path = sample_path(dataset, index)
            stem = output_name(dataset, index)
            (self.output_dir / stem).parent.mkdir(parents=True, exist_ok=True)
            labels = labels.cpu().numpy()
            # the dataset's own label values: with reduce_zero_label (ADE20K) class k is k + 1 on disk
            stored = labels + 1 if getattr(trainer.datamodule, "reduce_zero_label", False) else labels
            if stored.max(initial=0) > 255:  # beyond a palette: a 16-bit grey PNG of the indices
                Image.fromarray(stored.astype(np.uint16)).save(self.output_dir / f"{stem}.png")
            else:
                png = Image.fromarray(stored.astype(np.uint8))  # mode L; putpalette turns it into P
                colours = palette if stored is labels else np.concatenate([np.zeros((1, 3), np.uint8), palette])
                png.putpalette(colours.reshape(-1).tolist())
                png.save(self.output_dir / f"{stem}.png")
            if self.overlay:
                if path is None:
                    _logger.warning("no image path for sample %d: overlay skipped", index)
                    continue
                from vitdense.data.images import decode_image  # (lazily: vitdense.data imports albumentations)

                overlay = blend(decode_image(path), labels, palette, self.alpha)  # upright, at the labels' size
                Image.fromarray(overlay).save(self.output_dir / f"{stem}_overlay.jpg")


class COCOResultsWriter(BasePredictionWriter):
    """Write the predicted boxes as a COCO results JSON (`image_id`, original `category_id`,
    `bbox` [x, y, width, height] pixels, `score`), readable by pycocotools' `loadRes` and
    any COCO tool; optionally draw them over the images. The dataset must be a COCO-format
    one (`CocoDetection`). With several processes each writes `<stem>.rank<r>.json`.

    Args:
        output_file: the JSON to write (folders are created).
        draw_dir: if given, also write `<stem>.jpg` per image with its boxes drawn.
        score_threshold: boxes drawn from this score on (the JSON keeps every detection).
    """

    def __init__(
        self, output_file: str = "predictions.json", draw_dir: str | None = None, score_threshold: float = 0.5
    ) -> None:
        super().__init__(write_interval="batch")
        self.output_file = Path(output_file)
        self.draw_dir = Path(draw_dir) if draw_dir else None
        self.score_threshold = score_threshold
        self.results: list[dict] = []

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.results = []

    def write_on_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        prediction: Any,
        batch_indices: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if prediction is None:  # a batch whose every image was skipped (on_bad_sample=skip)
            return
        # (vitdense.data imports albumentations; callbacks stay light until they write)
        from vitdense.data.coco import CocoIndex, coco_results
        from vitdense.data.images import decode_image

        dataset = predicted_dataset(trainer, dataloader_idx)
        if isinstance(getattr(dataset, "index", None), CocoIndex):  # a COCO split: its own image ids
            self.results += coco_results(prediction, dataset.index.image_ids, dataset.index.category_ids)
        else:  # a folder of images: ids 1..N in file order, and the file names
            category_ids = getattr(trainer.datamodule, "category_ids", None) or range(1, pl_module.num_classes + 1)
            names = [str(p.relative_to(dataset.root)) for p in dataset.image_paths]
            self.results += coco_results(prediction, range(1, len(names) + 1), category_ids, names)
        if self.draw_dir is None:
            return
        self.draw_dir.mkdir(parents=True, exist_ok=True)
        names = getattr(pl_module, "class_names", None)
        palette = palette_of(trainer.datamodule, pl_module.num_classes)
        for index, boxes, scores, labels in zip(
            prediction.index.tolist(), prediction.boxes, prediction.scores, prediction.labels, strict=True
        ):
            keep = scores >= self.score_threshold
            image = decode_image(Path(dataset.image_paths[index]))  # what the model saw: upright, 8-bit RGB
            drawn = draw_boxes(
                image, boxes[keep].cpu().numpy(), labels[keep].tolist(), names, palette, scores[keep].tolist()
            )
            out = self.draw_dir / f"{output_name(dataset, index)}.jpg"
            out.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(drawn).save(out)

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = rank_path(self.output_file, trainer)
        path.write_text(json.dumps(self.results))
        _logger.info("wrote %d detections to %s", len(self.results), path)


def task_callbacks(
    trainer: L.Trainer, prediction_writer: Callable[[Path], BasePredictionWriter | None]
) -> list[L.Callback]:
    """The callbacks a vitdense task adds to its trainer (`configure_callbacks`): every run
    counts skipped samples (`SkippedSamples`); `fit` keeps the random states for exact resume
    (`ResumeRNG`); `predict` without a writer of the user's writes the task's own
    (`prediction_writer(output_dir)`) under `<default_root_dir>/predictions/` and says where."""
    callbacks: list[L.Callback] = [SkippedSamples()]
    if trainer.state.fn == TrainerFn.FITTING:
        callbacks.append(ResumeRNG())
    if trainer.predicting and not any(isinstance(c, BasePredictionWriter) for c in trainer.callbacks):
        output_dir = Path(trainer.default_root_dir) / "predictions"
        writer = prediction_writer(output_dir)
        if writer is not None:
            rank_zero_info(f"predictions go to {output_dir}/ (add a writer callback to choose)")
            callbacks.append(writer)
    return callbacks
