"""Feature distillation of a frozen teacher encoder into a student ViT on images without labels.

The objective (`FeatureDistillation`) is two mean squared errors through learned projectors
(student width -> teacher width):

- patch tokens: LightlyTrain's `distillationv2` objective (its `method="distillation"` from
  0.7.0 until 0.15.0 made v3 the default; its docs name Beyer et al., "Knowledge distillation:
  A good teacher is patient and consistent", CVPR 2022, as the inspiration): the patch tokens
  of the teacher's last `teacher_blocks` blocks, each through its final norm, concatenated
  along the channels, against a linear projection of the student's patch tokens (truncated
  normal, std 0.02), MSE over tokens and channels, no other normalisation;
- class token: timm 1.0.31's `timm.task.distillation.FeatureDistillationTask`: MSE between the
  student's pooled pre-logits through a linear projector and the teacher's (a ViT with a class
  token: the class token after the final norm).

Grids: LightlyTrain resamples the projected student map to the teacher's grid; here the
teacher's patch-token map is resampled to the student's (bilinear, `align_corners=False`, on the
[h, w] token map, weights renormalised over the teacher's non-padding tokens), so that every
student token has a target and padding is masked at the student's stride. Where the two grids
are equal (same patch size and image size) the two formulations are the same number.

Not taken from LightlyTrain: its mixup of the inputs (it would make cached teacher features
wrong) and its LARS optimiser (the task takes any optimizer).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import nn

from vitdense.backbone import VisionTransformer
from vitdense.backbone.vit import ViTFeatures
from vitdense.core.errors import ConfigError
from vitdense.core.precision import bf16_support
from vitdense.types import ImageSizes, LabeledImages, Size


class TeacherFeatures(NamedTuple):
    """What the teacher says about a batch.

    Attributes:
        patches: [B, h, w, C] patch tokens on the teacher's (padded) grid, C = teacher_blocks * D_t;
            zero on padding.
        pooled: [B, D_t] the teacher's pooled features (class token after the final norm; the
            mean of its non-padding patch tokens for a model without one).
        image_sizes: the batch's `ImageSizes` at the teacher's patch stride.
    """

    patches: torch.Tensor
    pooled: torch.Tensor
    image_sizes: ImageSizes


class DistillationOutput(NamedTuple):
    """The student's projected features beside their targets.

    Attributes:
        pred: [B, N, C] projected student patch tokens (N on the student's padded grid).
        target: [B, N, C] the teacher's patch tokens resampled to the student's grid.
        keep: [B, N] bool, the tokens in the loss (image, not padding).
        pooled_pred: [B, D_t] projected student pooled features.
        pooled_target: [B, D_t] the teacher's pooled features.
        image_sizes: the batch's `ImageSizes` at the student's patch stride.
    """

    pred: torch.Tensor
    target: torch.Tensor
    keep: torch.Tensor
    pooled_pred: torch.Tensor
    pooled_target: torch.Tensor
    image_sizes: ImageSizes


def pooled_features(features: ViTFeatures) -> torch.Tensor:
    """[B, D]: the class token after the final norm (timm's pre-logits of a `global_pool='token'`
    ViT), or, for a model without one, the mean of the non-padding patch tokens."""
    if features.cls_token is not None:
        return features.cls_token
    padding = features.padding()
    if padding is None:
        return features.patch_tokens.mean(1)
    keep = (~padding).unsqueeze(-1).to(features.patch_tokens.dtype)
    return (features.patch_tokens * keep).sum(1) / keep.sum(1).clamp_min(1)


def resample_to_grid(tokens: torch.Tensor, valid: torch.Tensor | None, size: Size) -> tuple[torch.Tensor, torch.Tensor]:
    """A token map resampled to another grid, padding left out.

    Args:
        tokens: [B, h, w, C] token map (the teacher's).
        valid: [B, h, w] bool, True on non-padding tokens; None: all are.
        size: (h', w') the grid to resample to (the student's).

    Returns:
        [B, h', w', C] bilinear resampling (`align_corners=False`) of the valid tokens, the
        weights of each output renormalised over the valid ones it reads, and [B, h', w'] the
        valid share of those weights (0: the output read padding only). Both grids are taken to
        cover the same padded image (exact when its sides are multiples of both patch sizes).
    """
    b, h, w, _ = tokens.shape
    if (h, w) == tuple(size):
        weight = torch.ones(b, h, w, device=tokens.device) if valid is None else valid.float()
        return tokens, weight
    x = tokens.permute(0, 3, 1, 2).float()
    if valid is None:
        out = F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=False)
        return out.permute(0, 2, 3, 1), torch.ones(b, *size, device=tokens.device)
    m = valid[:, None].float()
    num = F.interpolate(x * m, size=tuple(size), mode="bilinear", align_corners=False)
    den = F.interpolate(m, size=tuple(size), mode="bilinear", align_corners=False)
    return (num / den.clamp_min(1e-6)).permute(0, 2, 3, 1), den[:, 0]


class FeatureDistillation(nn.Module):
    """The loss and projectors of feature distillation (see the module's docstring): built as
    `objective(embed_dim, teacher_dim)` by the task (YAML: `class_path` + `init_args` for the rest).

    Args:
        embed_dim: the student's width.
        teacher_dim: the teacher's width D_t.
        teacher_blocks: how many of the teacher's last blocks make the patch target
            (LightlyTrain v2: 2, their normalised outputs concatenated: C = 2 D_t).
        patch_weight: weight of the patch-token MSE.
        cls_weight: weight of the class-token MSE (0: patch tokens only, LightlyTrain v2's loss).
    """

    def __init__(
        self,
        embed_dim: int,
        teacher_dim: int,
        teacher_blocks: int = 1,
        patch_weight: float = 1.0,
        cls_weight: float = 1.0,
    ) -> None:
        super().__init__()
        if teacher_blocks < 1:
            raise ConfigError(f"objective.init_args.teacher_blocks={teacher_blocks}: take at least the last block (1)")
        self.teacher_blocks = teacher_blocks
        self.patch_weight, self.cls_weight = patch_weight, cls_weight
        # LightlyTrain v2's projection head: truncated normal, std 0.02 (bias: PyTorch's default)
        self.patch_proj = nn.Linear(embed_dim, teacher_blocks * teacher_dim)
        trunc_normal_(self.patch_proj.weight, std=0.02)
        # timm's FeatureDistillationTask projection: an nn.Linear at PyTorch's default initialisation
        self.cls_proj = nn.Linear(embed_dim, teacher_dim)

    def forward(self, student: ViTFeatures, teacher: TeacherFeatures) -> DistillationOutput:
        """The student's features [B, N, D] (`ViTFeatures`) projected beside the teacher's,
        resampled to the student's grid."""
        sizes = student.image_sizes
        b, n, _ = student.patch_tokens.shape
        padding = sizes.mask(student.patch_tokens.device) if sizes.has_padding else None  # [B, h, w]
        tsizes = teacher.image_sizes
        tvalid = ~tsizes.mask(teacher.patches.device) if tsizes.has_padding else None
        target, weight = resample_to_grid(teacher.patches.float(), tvalid, student.grid_size)
        keep = weight > 0
        if padding is not None:
            keep = keep & ~padding
        return DistillationOutput(
            pred=self.patch_proj(student.patch_tokens),
            target=target.reshape(b, n, -1),  # fp32: the teacher's numbers, whatever the student's autocast
            keep=keep.reshape(b, n),
            pooled_pred=self.cls_proj(pooled_features(student)),
            pooled_target=teacher.pooled.float(),
            image_sizes=sizes,
        )

    def patch_loss(self, output: DistillationOutput) -> torch.Tensor:
        """Mean squared error over the kept tokens and their channels (LightlyTrain's `MSELoss()`
        when no token is padding)."""
        per_token = (output.pred.float() - output.target.float()).pow(2).mean(-1)  # [B, N]
        keep = output.keep.float()
        return (per_token * keep).sum() / keep.sum().clamp_min(1)

    def cls_loss(self, output: DistillationOutput) -> torch.Tensor:
        """timm's `F.mse_loss(student_features, teacher_features)`."""
        return F.mse_loss(output.pooled_pred.float(), output.pooled_target.float())

    def losses(self, output: DistillationOutput) -> dict[str, torch.Tensor]:
        """{"loss": weighted total, "loss_patch": ..., "loss_cls": ...} (terms unweighted)."""
        patch, cls = self.patch_loss(output), self.cls_loss(output)
        return {"loss": self.patch_weight * patch + self.cls_weight * cls, "loss_patch": patch, "loss_cls": cls}


#: an objective from the student's and the teacher's widths: `objective(embed_dim, teacher_dim)`
ObjectiveFactory = Callable[[int, int], nn.Module]


def teacher_autocast(device: torch.device) -> bool:
    """Whether the teacher runs under bf16 autocast on `device`: only where it computes bf16
    natively (`vitdense.core.precision`: measured on a CPU), never emulated."""
    return bf16_support(device.type).native


class FrozenTeacher(nn.Module):
    """A teacher encoder that never trains: no gradients, always in eval mode, run under
    `torch.no_grad` and in bf16 autocast where the device computes bf16 natively.

    Images arrive normalised for the student (`set_normalization`: the data's mean and std);
    they are re-normalised for the teacher's `pretrained_cfg` mean and std when these differ
    (timm's `DistillationTeacher.normalize_input`).

    Args:
        encoder: the teacher (a vitdense `VisionTransformer`).
        blocks: how many of its last blocks make the patch features (each through the final norm).
        bf16: run under bf16 autocast: None (default) where the device computes bf16 natively
            (`teacher_autocast`), False never (fp32: the numbers of the references), True always.
        scale: the teacher sees the images resized by this factor (bilinear on the padded batch,
            antialiased when shrinking; each image's size scaled and rounded), e.g. 2 for a
            teacher with twice the student's patch size to give the student's grid; 1: as they are.
    """

    def __init__(
        self, encoder: VisionTransformer, blocks: int = 1, bf16: bool | None = None, scale: float = 1.0
    ) -> None:
        super().__init__()
        if scale <= 0:
            raise ConfigError(f"teacher scale={scale}: the factor the teacher's images are resized by must be > 0")
        self.encoder = encoder
        self.blocks = blocks
        self.bf16 = bf16
        self.scale = scale
        encoder.requires_grad_(False)
        encoder.eval()
        cfg = getattr(encoder, "pretrained_cfg", {}) or {}
        mean, std = cfg.get("mean", (0.5, 0.5, 0.5)), cfg.get("std", (0.5, 0.5, 0.5))
        self.register_buffer("teacher_mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), False)
        self.register_buffer("teacher_std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1), False)
        self.register_buffer("data_mean", self.teacher_mean.clone(), False)
        self.register_buffer("data_std", self.teacher_std.clone(), False)

    @property
    def embed_dim(self) -> int:
        return self.encoder.embed_dim

    def train(self, mode: bool = True) -> FrozenTeacher:
        return super().train(False)  # frozen: always eval (dropout, drop path off)

    def uses_bf16(self, device: torch.device) -> bool:
        """Whether the teacher runs in bf16 on `device` (see `bf16`)."""
        return teacher_autocast(device) if self.bf16 is None else self.bf16

    def set_normalization(self, mean: Sequence[float], std: Sequence[float]) -> None:
        """The mean and std [C] the data normalised the images with."""
        self.data_mean.copy_(torch.as_tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.data_std.copy_(torch.as_tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def input_sizes(self, image_sizes: ImageSizes) -> ImageSizes:
        """The `ImageSizes` (in pixels) of the batch as the teacher sees it (`scale`)."""
        if self.scale == 1.0:
            return image_sizes
        s = self.scale
        padded = (max(1, round(image_sizes.padded[0] * s)), max(1, round(image_sizes.padded[1] * s)))
        sizes = tuple(
            (min(max(1, round(h * s)), padded[0]), min(max(1, round(w * s)), padded[1])) for h, w in image_sizes.sizes
        )
        return ImageSizes(sizes, padded)

    @torch.no_grad()
    def forward(self, images: torch.Tensor, image_sizes: ImageSizes | None = None) -> TeacherFeatures:
        """images [B, C, H, W] normalised for the student, padded as `image_sizes` says."""
        if self.scale != 1.0:
            image_sizes = self.input_sizes(image_sizes or ImageSizes.full(images.shape[0], tuple(images.shape[-2:])))
            images = F.interpolate(
                images, size=image_sizes.padded, mode="bilinear", align_corners=False, antialias=self.scale < 1
            )
        if not (torch.equal(self.data_mean, self.teacher_mean) and torch.equal(self.data_std, self.teacher_std)):
            images = (images * self.data_std + self.data_mean - self.teacher_mean) / self.teacher_std
        with torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=self.uses_bf16(images.device)):
            last = tuple(range(-self.blocks, 0)) if self.blocks > 1 else ()
            f = self.encoder(images, image_sizes, intermediates=last, norm_intermediates=True)
        p = self.encoder.num_prefix_tokens
        maps = [y[:, p:] for y in f.intermediates] if self.blocks > 1 else [f.patch_tokens]
        patches = torch.cat(maps, -1).float()
        if f.image_sizes.has_padding:
            patches = patches.masked_fill(f.image_sizes.mask(patches.device).flatten(1)[..., None], 0.0)
        b = patches.shape[0]
        return TeacherFeatures(patches.reshape(b, *f.grid_size, -1), pooled_features(f).float(), f.image_sizes)


class FeatureDistillationModel(nn.Module):
    """student backbone + the objective's projectors, and the frozen teacher beside them.

    The teacher is held outside the module tree (moved with the model by `_apply`, never in
    `parameters()` or `state_dict()`): checkpoints hold the student and the projectors only,
    so `backbone.checkpoint: <this run's last.ckpt>` finds one encoder in them, and the
    teacher is rebuilt from the task's `teacher` config.
    """

    def __init__(self, backbone: VisionTransformer, objective: nn.Module, teacher: FrozenTeacher | None) -> None:
        super().__init__()
        self.backbone = backbone
        self.objective = objective
        self.__dict__["teacher"] = teacher

    @property
    def head(self) -> nn.Module:
        return self.objective

    def _apply(self, fn: Callable, recurse: bool = True) -> FeatureDistillationModel:
        super()._apply(fn, recurse)
        if self.teacher is not None:
            self.teacher._apply(fn, recurse)
        return self

    def forward(
        self,
        images: torch.Tensor,
        image_sizes: ImageSizes | None = None,
        teacher: TeacherFeatures | None = None,
    ) -> DistillationOutput:
        """images [B, 3, H, W] padded as `image_sizes` says; `teacher`: its features of the
        same images (e.g. from a cache), else the teacher computes them."""
        if teacher is None:
            if self.teacher is None:
                raise ConfigError("this model was rebuilt without its teacher: give the teacher's features")
            teacher = self.teacher(images, image_sizes)
        return self.objective(self.backbone(images, image_sizes), teacher)


@dataclass(frozen=True)
class FeatureDistillationInference:
    """How a `FeatureDistillationTask` checkpoint is rebuilt without its task: the student and
    the projectors (`objective(embed_dim, teacher_dim)`), no teacher. It predicts nothing:
    what distillation makes is the student backbone."""

    teacher_dim: int
    result_type: ClassVar[type | None] = None

    def build(self, backbone: VisionTransformer, head: Callable[..., nn.Module]) -> FeatureDistillationModel:
        return FeatureDistillationModel(backbone, head(backbone.embed_dim, self.teacher_dim), None)

    def sample(self, image: torch.Tensor, size: Size, index: int) -> LabeledImages:
        return LabeledImages.unlabeled(image, size, index)

    def predict(self, model: FeatureDistillationModel, batch: Any) -> Any:
        raise TypeError(
            "a distillation checkpoint predicts nothing: use its student backbone "
            "(vitdense.load_model(ckpt).backbone, or backbone.checkpoint in a task's config)"
        )


def file_fingerprint(path: str | Path) -> str:
    """A file's absolute path, size and modification time (a changed file is another key)."""
    path = Path(path).resolve()
    st = path.stat()
    return f"{path}|{st.st_size}|{st.st_mtime_ns}"


def view_fingerprint(image: torch.Tensor) -> str:
    """sha1 of a view's pixels [C, h, w] (what the teacher saw), to tell another view of the same file."""
    return hashlib.sha1(image.detach().float().contiguous().cpu().numpy().tobytes()).hexdigest()


class TeacherFeatureCache:
    """Teacher features on disk, one file per image: `folder/<teacher key>/<sha1 of the image
    file's path, size and mtime>.pt` ({"view", "patches" [h, w, C], "pooled" [D]}, float32,
    read back with `torch.load(weights_only=True)`).

    Limits: an entry is the teacher's features of ONE view of the file, the first one seen.
    Cached features are right only for views that are the same every epoch (no random crop,
    flip or colour jitter; evaluation transforms); each entry records its view's pixel hash,
    and a different view of a cached file raises `ConfigError` rather than train on features of
    another crop. The teacher key hashes the teacher's config, its weights file's fingerprint,
    the blocks taken, whether it ran in bf16 and its input scale: another teacher never reads these entries.
    """

    def __init__(self, folder: str | Path, teacher_key: str) -> None:
        self.root = Path(folder) / teacher_key
        self.root.mkdir(parents=True, exist_ok=True)
        self.hits = self.misses = 0

    @staticmethod
    def teacher_key(config: Any, blocks: int, bf16: bool, scale: float = 1.0) -> str:
        """The teacher's identity: its config's fields, its weights file, blocks, precision, input scale."""
        fields = {k: getattr(config, k) for k in ("name", "pretrained", "img_size", "model_args")}
        weights = file_fingerprint(config.checkpoint) if getattr(config, "checkpoint", None) else None
        text = json.dumps(
            {**fields, "weights": weights, "blocks": blocks, "bf16": bf16, "scale": scale}, sort_keys=True, default=str
        )
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    def entry(self, source: str | Path) -> Path:
        return self.root / f"{hashlib.sha1(file_fingerprint(source).encode()).hexdigest()}.pt"

    def get(self, source: str | Path, view: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(patches [h, w, C], pooled [D]) of `source`'s view `view`, or None if not cached."""
        path = self.entry(source)
        if not path.is_file():
            self.misses += 1
            return None
        stored = torch.load(path, map_location="cpu", weights_only=True)
        if stored["view"] != view:
            raise ConfigError(
                f"teacher_cache: {source} arrived as another view than the cached one (random augmentation): "
                "cached teacher features are of one fixed view per image; turn random crops and flips off "
                "(UnlabeledImagesDataModule: scale: [1.0, 1.0], hflip: 0.0) or set model.init_args.teacher_cache: null"
            )
        self.hits += 1
        return stored["patches"], stored["pooled"]

    def put(self, source: str | Path, view: str, patches: torch.Tensor, pooled: torch.Tensor) -> None:
        path = self.entry(source)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        torch.save(
            {"view": view, "patches": patches.detach().float().cpu(), "pooled": pooled.detach().float().cpu()}, tmp
        )
        tmp.replace(path)  # atomic: a reader never sees half a file
