"""vitdense: one Vision Transformer backbone, interchangeable Lightning tasks.

`vitdense.load_model("run.ckpt")` returns a trained checkpoint's plain model
(`vitdense.models`), ready to call on images without Lightning.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["load_model"]


def __getattr__(name: str) -> Any:
    # lazily: `import vitdense.types` must not pull in Lightning
    if name == "load_model":
        from vitdense.checkpoint import load_model

        return load_model
    raise AttributeError(f"module 'vitdense' has no attribute {name!r}")
