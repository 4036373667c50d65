"""Hub weights of a `pretrained: true` backbone: fetched once per node, loaded by every
process, and never when a checkpoint's weights replace them anyway (so a restored run works
offline).

The contract, for a LightningModule that mixes in `PretrainedBackbone`:
- it has `backbone` (built at its random initialisation: `BackboneConfig.build(load_pretrained=False)`)
  and `backbone_config`, and calls `track_pretrained()` once both exist;
- Lightning calls `prepare_data` on one process per node (which fetches) before `setup` on
  every process (which loads);
- the trainer says whether it will restore a checkpoint: `trainer.ckpt_path`, which
  Lightning sets only after `setup`, or `trainer.weights_from_checkpoint`, which vitdense's
  `Trainer` sets as soon as fit/validate/test/predict is called. With Lightning's own
  Trainer and a `ckpt_path`, the weights are fetched and then replaced by the checkpoint's.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from torch import nn

from vitdense.core.errors import ConfigError


def _mark_weights_loaded(module: nn.Module, incompatible_keys: Any) -> None:
    """After a state dict is loaded into the module: its weights are no longer the hub's to load."""
    module.pretrained_loaded = True


def restores_checkpoint(trainer: Any) -> bool:
    """The trainer will load a checkpoint's weights into its module (see the module's docstring)."""
    return trainer.ckpt_path is not None or getattr(trainer, "weights_from_checkpoint", False)


class PretrainedBackbone:
    """Fetches and loads a `pretrained` backbone's hub weights in `prepare_data`/`setup`."""

    #: the backbone holds its final weights (hub weights loaded, or a state dict loaded over them)
    pretrained_loaded: bool = True

    def track_pretrained(self) -> None:
        """Start tracking: hub weights are due if the config asks for them; any state dict
        loaded into the module (a checkpoint) replaces them for good."""
        self.pretrained_loaded = not self.backbone_config.pretrained
        self.register_load_state_dict_post_hook(_mark_weights_loaded)

    def fetch_pretrained(self) -> None:
        """Download the backbone's hub weights into the local cache."""
        self.backbone_config.hub_weights(self.backbone.img_size)

    def load_pretrained(self) -> None:
        """Load the backbone's hub weights (from the cache once fetched). Called by `setup`;
        call it yourself to use a task with `pretrained: true` outside a Trainer."""
        self.backbone.load_state_dict(self.backbone_config.hub_weights(self.backbone.img_size).state_dict())
        self.pretrained_loaded = True

    def prepare_data(self) -> None:
        if not self.pretrained_loaded and not restores_checkpoint(self.trainer):
            self.fetch_pretrained()

    def setup(self, stage: str) -> None:
        if not self.pretrained_loaded and not restores_checkpoint(self.trainer):
            self.load_pretrained()


class PretrainedLoaded(L.Callback):
    """Refuses to run a task whose backbone still waits for its pretrained weights when the
    loop starts: its class overrides `setup` without calling `super().setup(stage)`, which
    loads them, and would otherwise train or predict from random weights without a word."""

    def check(self, pl_module: L.LightningModule) -> None:
        if not getattr(pl_module, "pretrained_loaded", True):
            raise ConfigError(
                f"{type(pl_module).__name__}: the backbone's pretrained weights were not loaded; its setup() must "
                "call super().setup(stage), which loads them"
            )

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.check(pl_module)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.check(pl_module)

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.check(pl_module)

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.check(pl_module)
