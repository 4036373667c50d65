"""Callbacks that write what tasks predict."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import BasePredictionWriter


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
        path = self.output_file
        if trainer.world_size > 1:
            path = path.with_name(f"{path.stem}.rank{trainer.global_rank}{path.suffix}")
        path.parent.mkdir(parents=True, exist_ok=True)
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
        names = getattr(pl_module, "class_names", None)
        dataloaders = trainer.predict_dataloaders
        loader = dataloaders[dataloader_idx] if isinstance(dataloaders, list) else dataloaders
        samples = getattr(loader.dataset, "samples", None)
        k = prediction.classes.shape[1]
        if batch_idx == 0 and self._file.tell() == 0:
            header = ["index", "path"] + [f"{c}_{i}" for i in range(1, k + 1) for c in ("class", "prob")]
            self._writer.writerow(header)
        for index, probs, classes in zip(
            prediction.index.tolist(), prediction.probs.tolist(), prediction.classes.tolist(), strict=True
        ):
            path = str(samples[index][0]) if samples is not None and index >= 0 else ""
            row: list = [index, path]
            for c, p in zip(classes, probs, strict=True):
                row += [names[c] if names else c, f"{p:.6f}"]
            self._writer.writerow(row)

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
