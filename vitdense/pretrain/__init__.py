"""Self-supervised pre-training on images without labels: the paper's masked patch
prediction (`MaskedPatchPrediction`) and MAE (`MaskedAutoencoder`), their masking
(`masking`) and patch targets (`targets`). The task is `vitdense.tasks.MaskedImageModelingTask`; feature distillation of a
frozen teacher (`distillation`) is `vitdense.tasks.FeatureDistillationTask`."""

from vitdense.pretrain.distillation import FeatureDistillation, FrozenTeacher, TeacherFeatureCache
from vitdense.pretrain.masking import Corruption, TokenMasking, corrupt_tokens, random_masking
from vitdense.pretrain.objectives import (
    MaskedAutoencoder,
    MaskedImageObjective,
    MaskedImageOutput,
    MaskedPatchPrediction,
)
from vitdense.pretrain.targets import MeanColorTarget, PatchTarget, PixelTarget, patchify, unpatchify

__all__ = [
    "Corruption",
    "FeatureDistillation",
    "FrozenTeacher",
    "MaskedAutoencoder",
    "MaskedImageObjective",
    "MaskedImageOutput",
    "MaskedPatchPrediction",
    "MeanColorTarget",
    "PatchTarget",
    "PixelTarget",
    "TeacherFeatureCache",
    "TokenMasking",
    "corrupt_tokens",
    "patchify",
    "random_masking",
    "unpatchify",
]
