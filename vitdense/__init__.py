"""vitdense: one Vision Transformer backbone, interchangeable Lightning tasks.

The backbone (`vitdense.backbone`: the paper's ViT and its ResNet hybrid, timm's Eva
family — DINOv3, EVA-02, Perception Encoder — with timm's names and weights) feeds the task
families of `vitdense.tasks`: image classification, linear probes, Segmenter semantic
segmentation, EoMT semantic / instance / panoptic segmentation, DETR and LW-DETR / RF-DETR
detection, DPT monocular depth, and pre-training without labels (masked patch prediction,
MAE). `python -m vitdense fit|validate|test|predict|export|serve` runs them from YAML
(`python -m vitdense --help` lists the commands and families).

`vitdense.load("run.ckpt")` returns a trained checkpoint's predictor: call it on image
files, PIL images, arrays or tensors and get typed results (`vitdense.deploy.predictor`).
`vitdense.load_model("run.ckpt")` returns its plain model (`vitdense.models`), a module
to call on normalised image tensors, script or export. `vitdense.Slicing(...)` predicts
large images in tiles (`vitdense.deploy.slicing`, SAHI's sliced inference):
`vitdense.load("det.ckpt", slicing=vitdense.Slicing(slice_height=512))`.
"""

from __future__ import annotations

from typing import Any

from vitdense.core.moved import install as _install_moved_paths

__version__ = "0.1.0"
__all__ = ["Slicing", "load", "load_model"]

_install_moved_paths()  # the module paths of before the layer-first layout, for one release


def __getattr__(name: str) -> Any:
    # lazily: `import vitdense.types` must not pull in Lightning
    if name == "load":
        from vitdense.deploy.predictor import load

        return load
    if name == "load_model":
        from vitdense.deploy.checkpoint import load_model

        return load_model
    if name == "Slicing":
        from vitdense.deploy.slicing import Slicing

        return Slicing
    raise AttributeError(f"module 'vitdense' has no attribute {name!r}")
