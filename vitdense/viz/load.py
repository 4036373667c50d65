"""What `python -m vitdense.viz` looks at: a vitdense training checkpoint (task, head and
normalisation), a timm-format or JAX weight file, or a timm architecture at random
initialisation; and images, prepared as the model expects them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from vitdense.backbone import VisionTransformer, create_backbone
from vitdense.checkpoint import Checkpoint
from vitdense.errors import ConfigError, NoTaskError

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
    checkpoint: str | None = None,
    model: str | None = None,
    model_args: dict[str, Any] | None = None,
    img_size: int | None = None,
) -> Model:
    """The model behind `checkpoint` and/or `model`, in evaluation mode on the CPU.

    - a `.ckpt` of a vitdense task (`python -m vitdense fit`, or `Trainer.fit` from Python):
      its task (backbone and head) and the normalisation its data used;
    - a weight file (timm `.safetensors`/`.pth`/`.bin`, or a JAX `.npz`) with `model`, the
      timm name of its architecture;
    - `model` alone: that architecture, randomly initialised (`model_args` overrides it).

    Raises:
        ConfigError: neither given, or a weight file without `model`.
        CheckpointError: the file cannot be read as either kind.
    """
    if checkpoint is None and model is None:
        raise ConfigError("give --checkpoint (a vitdense .ckpt or a weight file) and/or --model (a timm name)")
    if checkpoint is not None and Path(checkpoint).suffix.lower() not in WEIGHT_SUFFIXES:
        try:
            found = Checkpoint(checkpoint)
        except NoTaskError as err:
            if err.lightning and model is None:
                hint = "or look at its encoder alone: add --model <timm name of its architecture>"
                raise ConfigError(f"{err}; {hint}") from err
        else:
            return _from_task(found, img_size)
    if model is None:
        raise ConfigError(
            f"{checkpoint}: a weight file without its task; add --model <timm name of its architecture>, "
            "e.g. --model vit_base_patch16_224"
        )
    backbone = create_backbone(model, checkpoint=checkpoint, img_size=img_size, model_args=model_args).eval()
    cfg = backbone.pretrained_cfg
    return Model(
        backbone,
        None,
        tuple(cfg.get("mean", IMAGENET_DEFAULT_MEAN)),
        tuple(cfg.get("std", IMAGENET_DEFAULT_STD)),
        img_size or backbone.img_size[0],
        checkpoint or f"{model} (random initialisation)",
    )


def _from_task(found: Checkpoint, img_size: int | None) -> Model:
    task = found.task_type().load_from_checkpoint(found.path, map_location="cpu", weights_only=True).eval()
    cfg = task.backbone.pretrained_cfg
    mean = found.data.get("mean") or cfg.get("mean", IMAGENET_DEFAULT_MEAN)
    std = found.data.get("std") or cfg.get("std", IMAGENET_DEFAULT_STD)
    return Model(task.backbone, task, tuple(mean), tuple(std), img_size or task.backbone.img_size[0], str(found.path))


def load_images(paths: list[str]) -> list[tuple[str, np.ndarray]]:
    """(name, upright [H, W, 3] uint8) for every image file given or found in the folders given."""
    from vitdense.data.images import decode_image, find_images

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
