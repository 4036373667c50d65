"""Self-supervised pre-training on images without labels: the paper's masked patch
prediction (`MaskedPatchPrediction`) and MAE (`MaskedAutoencoder`), their masking
(`masking`) and patch targets (`targets`). The task is `vitdense.tasks.MaskedImageModelingTask`."""

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
    "MaskedAutoencoder",
    "MaskedImageObjective",
    "MaskedImageOutput",
    "MaskedPatchPrediction",
    "MeanColorTarget",
    "PatchTarget",
    "PixelTarget",
    "TokenMasking",
    "corrupt_tokens",
    "patchify",
    "random_masking",
    "unpatchify",
]
