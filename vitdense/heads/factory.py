"""Heads are injected as factories, `head(embed_dim, num_classes)` (`HeadFactory`; in YAML a
`class_path` + `init_args`), and recorded in a task's hyperparameters as plain data
(`HeadSpec`, `record_head`), so that a checkpoint rebuilds the head it was trained with."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn


def locate(class_path: str) -> Any:
    """The object named by a dotted path ("vitdense.heads.LinearDecoder"), imported.

    Raises:
        ImportError, AttributeError: no such module, or no such name in it.
    """
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


#: a head from the backbone's width D and the number of classes K: `head(embed_dim, num_classes)`;
#: in YAML a `class_path` (+ `init_args` for everything but those two), e.g. vitdense.heads.LinearDecoder
HeadFactory = Callable[[int, int], nn.Module]


@dataclass(frozen=True)
class HeadSpec:
    """A head factory as plain data, so that checkpoints rebuild the head they were trained
    with (`load_from_checkpoint`, also under `torch.load(weights_only=True)`).

    `HeadSpec("vitdense.heads.ClassificationHead", {"pool": "avg"})(192, 10)` builds
    `ClassificationHead(192, 10, pool="avg")`.

    Arguments that are themselves module factories (a detection head's `neck`) are recorded
    the same way, nested: `{"neck": {"class_path": ..., "init_args": {...}}}`.
    """

    class_path: str
    init_args: dict[str, Any]

    def __call__(self, *args: Any) -> nn.Module:
        # nested factories are plain data here (YAML, weights_only): rebuild them as specs
        kwargs = {
            k: HeadSpec(v["class_path"], dict(v.get("init_args") or {})) if is_spec_data(v) else v
            for k, v in self.init_args.items()
        }
        return locate(self.class_path)(*args, **kwargs)

    @classmethod
    def of(cls, factory: HeadFactory) -> HeadSpec | None:
        """The spec of a head class, or of a `functools.partial` of one (what `partial(...)`
        defaults and jsonargparse's `class_path`/`init_args` produce); None for other callables."""
        if isinstance(factory, HeadSpec):
            return factory
        if isinstance(factory, partial):
            func, args, kwargs = factory.func, factory.args, factory.keywords
        else:
            func, args, kwargs = factory, (), {}
        # jsonargparse wraps the class: partial(call_without_instantiate_context, instantiator, cls, **init_args)
        classes = [c for c in (func, *args) if inspect.isclass(c) and issubclass(c, nn.Module)]
        if len(classes) != 1 or (args and args[-1] is not classes[0]):
            return None
        init_args = {}
        for name, value in kwargs.items():
            nested = cls.of(value) if callable(value) else None
            init_args[name] = nested.as_data() if nested is not None else value
        return cls(f"{classes[0].__module__}.{classes[0].__qualname__}", init_args)

    def as_data(self) -> dict[str, Any]:
        """`{class_path, init_args}`, as YAML writes a class."""
        return {"class_path": self.class_path, "init_args": dict(self.init_args)}


def is_spec_data(value: Any) -> bool:
    """Whether `value` is a recorded factory (`HeadSpec.as_data`)."""
    return (
        isinstance(value, dict)
        and isinstance(value.get("class_path"), str)
        and set(value) <= {"class_path", "init_args"}
    )


# checkpoints written before this module existed name it where it lived: vitdense.deploy.checkpoint, and
# before that vitdense.tasks.base
torch.serialization.add_safe_globals(
    [HeadSpec, (HeadSpec, "vitdense.deploy.checkpoint.HeadSpec"), (HeadSpec, "vitdense.tasks.base.HeadSpec")]
)


def head_factory(head: HeadFactory | dict) -> HeadFactory:
    """`head` as given, or rebuilt from the `{class_path, init_args}` that `record_head` wrote
    into the hyperparameters (what `load_from_checkpoint` passes back)."""
    if isinstance(head, dict):
        return HeadSpec(head["class_path"], dict(head.get("init_args") or {}))
    return head


def record_head(hparams: dict[str, Any], head: HeadFactory) -> None:
    """Record `head` in a task's hyperparameters as plain data (`{class_path, init_args}`,
    as YAML writes a class, so LightningCLI merges it back into its config). A factory that
    is not a class or a partial of one cannot be recorded: `load_from_checkpoint` then needs
    `head=` again, and says so."""
    spec = HeadSpec.of(head)
    if spec is None:
        from lightning.pytorch.utilities import rank_zero_warn  # (a task's: Lightning is there; the heads need it not)

        rank_zero_warn(f"head {head!r} is not a class or a partial of one; pass head= to load_from_checkpoint")
        hparams.pop("head", None)
    else:
        hparams["head"] = spec.as_data()
