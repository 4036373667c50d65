"""Lightning's Trainer with `precision="auto"`: bf16 autocast where the hardware has bf16."""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
from lightning.fabric.connector import _PRECISION_INPUT
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from vitdense.precision import resolve_precision


class Trainer(L.Trainer):
    """`lightning.Trainer` whose `precision` also takes "auto" (vitdense's CLI uses it).

    "auto" resolves once, at construction, to "bf16-mixed" where the accelerator computes
    bf16 natively and to "32-true" elsewhere, and says which and why in one line. An
    explicit bf16 precision on a CPU without native bf16 runs as asked, with one warning.
    Every other argument is Lightning's own (forwarded unchanged).
    """

    def __init__(self, *, precision: Literal["auto"] | _PRECISION_INPUT | None = None, **kwargs: Any) -> None:
        # the signature forwards Lightning's arguments as they are: jsonargparse reads them from L.Trainer
        resolved = resolve_precision(precision, kwargs.get("accelerator", "auto"))
        if resolved.note:
            rank_zero_info(resolved.note)
        if resolved.warning:
            rank_zero_warn(resolved.warning)
        super().__init__(precision=resolved.precision, **kwargs)
