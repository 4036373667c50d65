"""Classification's result: top-k classes, names and probabilities; a line of classes.csv."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from vitdense.results.common import Origin, ResultContext, Size


@dataclass(frozen=True)
class ClassificationResult(Origin):
    """The `k` most probable classes of one image, best first.

    Attributes:
        classes: class indices [k].
        names: their names [k] (the indices as text where the checkpoint has no names).
        probs: their softmax probabilities [k].
        size: the image's (H, W) as given (upright).
        (and `Origin`'s source, image_id, file_name)
    """

    table_name: ClassVar[str | None] = "classes.csv"
    files_folder: ClassVar[str | None] = None

    classes: list[int]
    names: list[str]
    probs: list[float]
    size: Size

    @classmethod
    def from_prediction(cls, prediction: Any, context: ResultContext) -> list[ClassificationResult]:
        """A `ClassPrediction` (index [B], probs and classes [B, k]) -> B results."""
        names = context.class_names
        return [
            cls(classes, [names[k] for k in classes], probs, tuple(size), **context.origin(i))
            for i, (classes, probs, size) in enumerate(
                zip(prediction.classes.tolist(), prediction.probs.float().tolist(), context.sizes, strict=True)
            )
        ]

    @property
    def label(self) -> int:
        """The most probable class."""
        return self.classes[0]

    @property
    def name(self) -> str:
        return self.names[0]

    @property
    def prob(self) -> float:
        return self.probs[0]

    def to_dict(self) -> dict[str, Any]:
        top = [{"class": c, "name": n, "prob": p} for c, n, p in zip(self.classes, self.names, self.probs, strict=True)]
        return {"task": "classification", "size": list(self.size), "source": self.source, "top_k": top}

    def rows(self) -> list[dict[str, Any]]:
        """One CSV row: the image's index in its dataset, its file, its height and width as
        given, then class_i, prob_i."""
        row: dict[str, Any] = {"index": self.index if self.index is not None else -1, "path": self.source or ""}
        row["height"], row["width"] = self.size
        for i, (name, prob) in enumerate(zip(self.names, self.probs, strict=True), 1):
            row[f"class_{i}"], row[f"prob_{i}"] = name, f"{prob:.6f}"
        return [row]

    @classmethod
    def write_table(cls, rows: list[dict[str, Any]], path: Path) -> None:
        with path.open("w", newline="") as file:
            columns = list(rows[0]) if rows else ["index", "path"]
            writer = csv.DictWriter(file, columns)
            writer.writeheader()
            writer.writerows(rows)
