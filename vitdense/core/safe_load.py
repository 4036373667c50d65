"""Reading PyTorch's pickled files (`.pth`, `.pt`, `.bin`, `.ckpt`) without running their code.

Unpickling calls whatever a file names, so a weight file can run a command as it loads.
Every file vitdense reads from a user's path goes through `torch_load`: torch's
`weights_only` unpickler, which builds tensors, containers and plain values only, widened
by the few harmless globals that official checkpoints carry beside their weights (DeiT's
and MAE's `args` Namespace, numpy scalars such as a best accuracy). Anything else is
refused with one line naming the global and the opt-in; with the opt-in (a file the user
trusts) the file is loaded in full, with a warning.
"""

from __future__ import annotations

import argparse
import logging
import pickle
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitdense.core.errors import CheckpointError

_logger = logging.getLogger(__name__)

#: where a backbone weight file is trusted: the YAML key of `fit` and the flag of `python -m vitdense.viz`
TRUST_KEY = "model.init_args.backbone.trust_checkpoint"
TRUST_FLAG = "--trust_checkpoint"
TRUST_HINT = f"If you trust this file, set {TRUST_KEY}=true (python -m vitdense.viz: {TRUST_FLAG})"

try:
    from numpy._core.multiarray import scalar as _scalar
except ImportError:  # numpy 1
    from numpy.core.multiarray import scalar as _scalar

#: what official checkpoints carry beside their tensors, all plain data when built: an
#: argparse.Namespace (DeiT, MAE, timm's train.py), numpy scalars and their dtypes (numpy 1
#: pickles name the scalar `numpy.core...`, numpy 2 `numpy._core...`). Not numpy arrays:
#: no official checkpoint we know holds one, and an object array reaches further.
OFFICIAL_GLOBALS: list[Any] = [
    argparse.Namespace,
    (_scalar, "numpy.core.multiarray.scalar"),
    (_scalar, "numpy._core.multiarray.scalar"),
    np.dtype,
    *{type(np.dtype(code)) for code in "?bBhHiIlLqQefdgFDG"},  # numpy.dtypes.Float64DType, ...
]


@contextmanager
def official_globals() -> Iterator[None]:
    """Allow `OFFICIAL_GLOBALS` in `weights_only` loads within the block.

    Scoped, not registered once at import: importing vitdense must not change what
    `torch.load` accepts elsewhere in the user's process. Unlike torch's own `safe_globals`
    context, only the globals not already allowed are added and removed again, so a
    user's earlier `add_safe_globals([argparse.Namespace])` survives our loads. (torch keeps
    the allow-list per process, not per thread: a load in another thread meanwhile sees it too.)
    """
    already = set(torch.serialization.get_safe_globals())
    added = [g for g in OFFICIAL_GLOBALS if g not in already]
    with torch.serialization.safe_globals(added):
        yield


def refused_global(err: BaseException) -> str:
    """What torch's `weights_only` unpickler refused, from its message: "GLOBAL os.system",
    or its own first sentence for other refusals."""
    message = str(err)
    found = re.search(r"Unsupported global: (GLOBAL \S+)", message)
    if found:
        return found.group(1)
    found = re.search(r"WeightsUnpickler error: ([^\n]*)", message)
    return found.group(1).split(". ")[0].rstrip(".") if found else type(err).__name__


def torch_load(path: str | Path, label: str, trust: bool = False, hint: str = TRUST_HINT, mmap: bool = False) -> Any:
    """The object a torch file holds, on the CPU, loaded without running code from it.

    Args:
        path: a `torch.save` file (zip or legacy format).
        label: what the file is to the user, starting the error ("checkpoint", "ckpt_path").
        trust: load a file holding other objects in full (`weights_only=False`): it can run
            any code, so only for a file the user trusts; a warning says it happened.
        hint: the refusal's last words: how to opt in, or what to pass instead.
        mmap: memory-map the tensors (they stay on disk until used).

    Raises:
        CheckpointError: (without `trust`) the file holds objects beyond torch's `weights_only`
            allow-list and `OFFICIAL_GLOBALS`; one line naming the file, the object and `hint`.
        pickle.UnpicklingError, RuntimeError, ...: the file is not a torch file at all.
    """
    try:
        with official_globals():
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        if "Weights only load failed" not in str(err):
            raise  # corrupt or not a pickle at all: the caller says so
        if not trust:
            raise CheckpointError(
                f"{label} {path}: holds Python objects beyond torch's weights_only allow-list "
                f"({refused_global(err)}), which could run code as it loads: refused. {hint}"
            ) from err
    _logger.warning("%s %s: trusted, so loaded with weights_only=False (it may run code as it loads)", label, path)
    return torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
