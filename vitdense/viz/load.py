"""What `python -m vitdense.viz` looks at: a vitdense training checkpoint (`--ckpt_path`:
task, head and normalisation), a timm-format or JAX weight file (`--weights`), or a timm
architecture at random initialisation; and images, prepared as the model expects them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from vitdense.backbone import VisionTransformer, create_backbone
from vitdense.core.errors import CheckpointError, ConfigError, NoTaskError
from vitdense.deploy.checkpoint import Checkpoint

#: weight files that are never Lightning checkpoints
WEIGHT_SUFFIXES = (".safetensors", ".npz", ".bin")


@dataclass
class Model:
    """A backbone to look into, the task around it (None for bare weights), how its inputs
    are normalised and the square side they are resized to, and where it came from."""

    backbone: VisionTransformer
    task: Any
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    img_size: int
    source: str


def load_model(
    ckpt_path: str | None = None,
    weights: str | None = None,
    model: str | None = None,
    model_args: dict[str, Any] | None = None,
    img_size: int | None = None,
    trust_checkpoint: bool = False,
) -> Model:
    """The model behind `ckpt_path`, or `weights` and/or `model`, in evaluation mode on the CPU.

    - `ckpt_path`, a `.ckpt` of a vitdense task (`python -m vitdense fit`, or `Trainer.fit`
      from Python): its task (backbone and head) and the normalisation its data used;
    - `weights`, a backbone weight file (timm `.safetensors`/`.pth`/`.bin`, a JAX `.npz`, or a
      Lightning `.ckpt` read for its encoder alone) with `model`, the timm name of its
      architecture; `trust_checkpoint` loads one holding Python objects beyond tensors
      (see `BackboneConfig.trust_checkpoint`);
    - `model` alone: that architecture, randomly initialised (`model_args` overrides it).

    Raises:
        ConfigError: nothing given, both files given, or weights without `model`.
        CheckpointError: the file cannot be read as its kind, or would run code as it loads.
    """
    if ckpt_path is not None and weights is not None:
        raise ConfigError("give --ckpt_path (a vitdense .ckpt) or --weights (a backbone weight file), not both")
    if ckpt_path is None and weights is None and model is None:
        raise ConfigError(
            "give --ckpt_path (a vitdense .ckpt), or --weights (a weight file) with --model, or --model alone "
            "(a timm name: random weights)"
        )
    if ckpt_path is not None:
        try:
            return _from_task(Checkpoint(ckpt_path), img_size)
        except NoTaskError as err:
            if err.lightning:
                hint = "or look at its encoder alone: --weights <this file> --model <timm name of its architecture>"
                raise ConfigError(f"{err}; {hint}") from err
            raise ConfigError(f"{err}; in python -m vitdense.viz: --weights <this file> --model <timm name>") from err
    if model is None:
        raise ConfigError(
            f"{weights}: a weight file without its task; add --model <timm name of its architecture>, "
            "e.g. --model vit_base_patch16_224"
        )
    backbone = create_backbone(
        model, checkpoint=weights, img_size=img_size, model_args=model_args, trust_checkpoint=trust_checkpoint
    ).eval()
    cfg = backbone.pretrained_cfg
    return Model(
        backbone,
        None,
        tuple(cfg.get("mean", IMAGENET_DEFAULT_MEAN)),
        tuple(cfg.get("std", IMAGENET_DEFAULT_STD)),
        img_size or backbone.img_size[0],
        weights or f"{model} (random initialisation)",
    )


def split_checkpoint(checkpoint: str, model: str | None) -> tuple[str | None, str | None]:
    """(ckpt_path, weights) for the deprecated `--checkpoint`, which took either: a weight
    suffix is weights; given `model`, a file that is not a task's checkpoint is read for its
    encoder, as before; anything else is a training checkpoint."""
    if Path(checkpoint).suffix.lower() in WEIGHT_SUFFIXES:
        return None, checkpoint
    if model is not None:
        try:
            Checkpoint(checkpoint)
        except CheckpointError:  # no task in it, or not loadable as one: the weights' reader says which
            return None, checkpoint
    return checkpoint, None


def _from_task(found: Checkpoint, img_size: int | None) -> Model:
    task = found.restore("cpu").eval()
    cfg = task.backbone.pretrained_cfg
    mean = found.data.get("mean") or cfg.get("mean", IMAGENET_DEFAULT_MEAN)
    std = found.data.get("std") or cfg.get("std", IMAGENET_DEFAULT_STD)
    return Model(task.backbone, task, tuple(mean), tuple(std), img_size or task.backbone.img_size[0], str(found.path))


def load_images(paths: list[str]) -> list[tuple[str, np.ndarray]]:
    """(name, upright [H, W, 3] uint8) for every image file given or found in the folders given."""
    from vitdense.core.images import decode_image, find_images

    found = []
    for path in map(Path, paths):
        files = find_images(path) if path.is_dir() else [path]
        found += [(f.stem, decode_image(f)) for f in files]
    if not found:
        raise ConfigError("no images: give image files or folders with --images")
    return found


def prepare(image: np.ndarray, model: Model) -> torch.Tensor:
    """[H, W, 3] uint8 -> [1, 3, S, S] normalised, resized whole to the model's square side
    (the analyses are defined on square inputs; the maps are stretched back over the image)."""
    side = model.img_size
    resized = np.asarray(Image.fromarray(image).resize((side, side), Image.BICUBIC), dtype=np.float32) / 255
    x = (torch.from_numpy(resized) - torch.tensor(model.mean)) / torch.tensor(model.std)
    return x.permute(2, 0, 1)[None].float()
