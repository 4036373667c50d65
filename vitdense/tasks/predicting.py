"""What a task predicts, as results people use: the task side of the one declaration per
task family (`vitdense.results`). `BaseTask` takes these hooks from `PredictsResults`:

    result_type                          what one image's prediction becomes (None: no predictions)
    predict_sample(image, size, index)   the sample an image becomes for `predict_step`
    to_results(prediction, context)      a batch's `predict_step` output -> a result per image
    prediction_writer(output_dir)        what `predict` writes when no writer is configured
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
from lightning.pytorch.callbacks import BasePredictionWriter

from vitdense.results.common import Result, ResultContext
from vitdense.training.callbacks import ResultWriter
from vitdense.types import LabeledImages, Size


class PredictsResults:
    """The prediction hooks of every vitdense task (a mixin of `BaseTask`)."""

    #: what one image's prediction becomes (`vitdense.results`); None: the task does not predict
    result_type: ClassVar[type | None] = None

    def predict_sample(self, image: torch.Tensor, size: Size, index: int) -> Any:
        """An image to predict on, as this task's `predict_step` takes it (one sample; the
        predictor pads a list of them into a batch): `image` [3, H, W] preprocessed
        (`vitdense.core.preprocess.Preprocess`), `size` its (H0, W0) as given. Default: an
        unlabelled `LabeledImages`."""
        return LabeledImages.unlabeled(image, size, index)

    def to_results(self, prediction: Any, context: ResultContext) -> list[Result]:
        """`predict_step`'s output for a batch as one typed result per image, through this
        task's `result_type` (`vitdense.results`): what `vitdense.load` returns, `predict`
        writes and the server answers."""
        if self.result_type is None:
            raise TypeError(
                f"{type(self).__name__} names no result_type, so its predictions cannot become results: set the "
                "class attribute result_type to a type with from_prediction, to_dict, write and rows "
                "(vitdense.results.ClassificationResult and its siblings are examples)"
            )
        return self.result_type.from_prediction(prediction, context)

    def prediction_writer(self, output_dir: Path) -> BasePredictionWriter | None:
        """What `predict` writes under `output_dir` when no writer is configured: the result
        type's files and table (`ResultWriter`); None without a `result_type`."""
        return ResultWriter(str(output_dir)) if self.result_type is not None else None
