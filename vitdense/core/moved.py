"""Import paths. Those of modules that moved when the package took its layer-first layout
(0.2): the old path still imports, as the new module itself, with a `DeprecationWarning`
naming the new path. For one release: YAML `class_path:`s, scripts and the class paths
recorded in checkpoints written before keep working. And the packages that import their
names on first use (`lazy_exports`).

(`vitdense.data.synthetic` and `vitdense.data.transforms` became packages: their old names
are answered by the packages' own `__getattr__`.)
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any

#: each old module path and the module that now holds its names
MOVED = {
    "vitdense.errors": "vitdense.core.errors",
    "vitdense.safe_load": "vitdense.core.safe_load",
    "vitdense.precision": "vitdense.core.precision",
    "vitdense.draw": "vitdense.core.draw",
    "vitdense.data.images": "vitdense.core.images",
    "vitdense.data.collate": "vitdense.types.collate",
    "vitdense.preprocess": "vitdense.core.preprocess",
    "vitdense.losses.class_losses": "vitdense.losses.classification",
    "vitdense.losses.pixel_losses": "vitdense.losses.segmentation",
    "vitdense.losses.depth_losses": "vitdense.losses.depth",
    "vitdense.losses.matcher": "vitdense.losses.detection",
    "vitdense.losses.set_criterion": "vitdense.losses.detection",
    "vitdense.losses.mask_matcher": "vitdense.losses.universal",
    "vitdense.losses.mask_criterion": "vitdense.losses.universal",
    "vitdense.panoptic_metrics": "vitdense.metrics.universal",
    "vitdense.depth_metrics": "vitdense.metrics.depth",
    "vitdense.depth_results": "vitdense.results.depth",
    "vitdense.mask_results": "vitdense.results.universal",
    "vitdense.panoptic": "vitdense.results.universal",
    "vitdense.mask_inference": "vitdense.models.universal",
    "vitdense.sliding_windows": "vitdense.models.windows",
    "vitdense.depth_types": "vitdense.types.depth",
    "vitdense.data.synthetic_seg": "vitdense.data.synthetic.segmentation",
    "vitdense.data.synthetic_det": "vitdense.data.synthetic.detection",
    "vitdense.data.synthetic_panoptic": "vitdense.data.synthetic.universal",
    "vitdense.data.synthetic_depth": "vitdense.data.synthetic.depth",
    "vitdense.data.cls_transforms": "vitdense.data.transforms.classification",
    "vitdense.data.seg_transforms": "vitdense.data.transforms.segmentation",
    "vitdense.data.det_transforms": "vitdense.data.transforms.detection",
    "vitdense.data.panoptic_transforms": "vitdense.data.transforms.universal",
    "vitdense.data.coco_panoptic": "vitdense.data.universal",
    "vitdense.checkpoint": "vitdense.deploy.checkpoint",
    "vitdense.predictor": "vitdense.deploy.predictor",
    "vitdense.slicing": "vitdense.deploy.slicing",
    "vitdense.export": "vitdense.deploy.export",
    "vitdense.export_runtimes": "vitdense.deploy.runtimes",
    "vitdense.serve": "vitdense.deploy.serve",
    "vitdense.optim": "vitdense.training.optim",
    "vitdense.callbacks": "vitdense.training.callbacks",
}


def deprecated(old: str, new: str, stacklevel: int = 3) -> None:
    warnings.warn(
        f"{old} moved to {new}; the old path works until the next release: import {new} "
        "(or name it in YAML class_path)",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


class _MovedLoader(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: Any) -> ModuleType:
        deprecated(spec.name, self.new, stacklevel=8)
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        # the module is the new one, already executed: nothing more to run
        pass


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _MovedLoader(new))


def install() -> None:
    """Answer the old paths (once per process)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())


def moved_attribute(package: str, where: dict[str, str], name: str) -> Any:
    """A name of a module that became `package`, from the module that now holds it, with
    the warning; AttributeError for a name it never had."""
    if name not in where:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    deprecated(f"{package}.{name}", f"{where[name]}.{name}")
    return getattr(importlib.import_module(where[name]), name)


def lazy_exports(package: str, where: dict[str, str]) -> Any:
    """A package's `__getattr__` (PEP 562) that imports each name of `where` ({name: module})
    from its module on first use: importing one module of the package does not import the
    others (nor what they import)."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(where[name]), name)

    return __getattr__
