"""What every result type shares: the context a prediction is read in (`ResultContext`), how
files are written (`WriteOptions`), the `Result` protocol and `Origin` (where the image came
from)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np

from vitdense.core.preprocess import LabelInfo

Size = tuple[int, int]

_logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResultContext:
    """What turning a batch's prediction into results needs beyond the prediction.

    Attributes:
        class_names: names of the K classes.
        labels: palette, dataset category ids and file convention (`LabelInfo`).
        sizes: each image's (H0, W0) as given (upright), in the batch's order.
        sources: each image's file, or None (arrays, tensors, PIL images).
        indexes: each image's position in the dataset predicted on, or None.
        image_ids: each image's id in its dataset (COCO's `image_id`), or None.
        file_names: each image's file name relative to the folder predicted on, or None.
        output_names: the name each image's files are written under (`predict`), or None.
    """

    class_names: Sequence[str]
    labels: LabelInfo
    sizes: Sequence[Size]
    sources: Sequence[str | None] = ()
    indexes: Sequence[int | None] = ()
    image_ids: Sequence[int | None] = ()
    file_names: Sequence[str | None] = ()
    output_names: Sequence[str | None] = ()

    def origin(self, i: int) -> dict[str, Any]:
        """Image `i`'s source, id and file name, as a result's keyword fields."""

        def at(values: Sequence[Any]) -> Any:
            return values[i] if i < len(values) else None

        return {
            "source": at(self.sources),
            "index": at(self.indexes),
            "image_id": at(self.image_ids),
            "file_name": at(self.file_names),
            "output_name": at(self.output_names),
        }


@dataclass(frozen=True)
class WriteOptions:
    """How `Result.write` writes an image's files: `pictures` (overlays, drawn boxes),
    boxes drawn from `score_threshold` on, colours blended with weight `alpha`."""

    pictures: bool = True
    score_threshold: float = 0.5
    alpha: float = 0.5


class Result(Protocol):
    """The contract of a task family's result type (see the module docstring)."""

    #: the run's table under `predict`'s output folder (None: none), and the folder of the images' files
    table_name: ClassVar[str | None]
    files_folder: ClassVar[str | None]
    source: str | None

    @classmethod
    def from_prediction(cls, prediction: Any, context: ResultContext) -> list[Result]: ...

    def to_dict(self) -> dict[str, Any]: ...

    def write(self, folder: Path, name: str, options: WriteOptions) -> None: ...

    def rows(self) -> list[dict[str, Any]]: ...

    @classmethod
    def write_table(cls, rows: list[dict[str, Any]], path: Path) -> None: ...


@dataclass(frozen=True)
class Origin:
    """Where an image came from (keyword fields every result type has).

    Attributes:
        source: the file (None for arrays, tensors and PIL images).
        index: its position in the dataset predicted on, or None.
        image_id: its id in the dataset predicted on (COCO's `image_id`), or None.
        file_name: its file name relative to the folder predicted on, or None.
        output_name: the name its files are written under by `predict` (`write`'s `name`;
            tables that refer to the files use it), or None.
    """

    source: str | None = field(default=None, kw_only=True)
    index: int | None = field(default=None, kw_only=True)
    image_id: int | None = field(default=None, kw_only=True)
    file_name: str | None = field(default=None, kw_only=True)
    output_name: str | None = field(default=None, kw_only=True, repr=False)

    def write(self, folder: Path, name: str, options: WriteOptions) -> None:
        """No files of its own (a family with a table only)."""

    def rows(self) -> list[dict[str, Any]]:
        return []

    @classmethod
    def write_table(cls, rows: list[dict[str, Any]], path: Path) -> None:
        """No table."""

    def picture_of_source(self) -> np.ndarray | None:
        """The image predicted on as upright [H, W, 3] uint8 (read from `source`), or None."""
        if self.source is None:
            return None
        from vitdense.core.images import decode_image  # (lazily: only where pictures are written)

        return decode_image(Path(self.source))
