"""The models themselves, without Lightning: a backbone, a head and the task's own pre- and
post-processing as plain `nn.Module`s that can be called on a tensor, scripted or exported.

Each task (`vitdense.tasks`) wraps one of these as `task.model` and adds the loss, the
metrics and the optimisation; a checkpoint's model is `vitdense.load_model(path)`.

    images [B, 3, H, W] (+ ImageSizes of a padded batch)
      ImageClassifier   -> logits [B, K]
      LinearProbe       -> logits of every probe head [H, B, K]
      Segmenter         -> pixel logits [B, K, H, W]; `segment` slides windows over whole images
      DETRDetector      -> DetectionOutput; `detect` -> boxes at each image's original size
      MaskedImageModel  -> MaskedImageOutput: a pre-training objective's predictions and targets
      EoMT              -> MaskClassOutput: class and mask logits per query (semantic, instance, panoptic)
      DPT               -> depth (or inverse depth) [B, 1, H, W]; `estimate` runs each size unpadded


One module per family (`vitdense.models.classification`, `.segmentation`, `.detection`,
`.universal`, `.depth`, `.pretrain`), sliding-window inference in `vitdense.models.windows`.

Every name is imported on first use (PEP 562): importing one family's module does not import
the others.
"""

from __future__ import annotations

from vitdense.core.moved import lazy_exports

#: each public name and the module that defines it
_WHERE = {
    "ImageClassifier": "vitdense.models.classification",
    "LinearProbe": "vitdense.models.classification",
    "Segmenter": "vitdense.models.segmentation",
    "Selection": "vitdense.models.detection",
    "postprocess": "vitdense.models.detection",
    "DETRDetector": "vitdense.models.detection",
    "semantic_inference": "vitdense.models.universal",
    "panoptic_inference": "vitdense.models.universal",
    "instance_inference": "vitdense.models.universal",
    "EoMT": "vitdense.models.universal",
    "DepthOutputKind": "vitdense.models.depth",
    "DPT": "vitdense.models.depth",
    "MaskedImageModel": "vitdense.models.pretrain",
    "Predict": "vitdense.models.windows",
    "window_starts": "vitdense.models.windows",
    "slide_inference": "vitdense.models.windows",
    "segment_image": "vitdense.models.windows",
    "segment_batch": "vitdense.models.windows",
}

__all__ = sorted(_WHERE)

__getattr__ = lazy_exports(__name__, _WHERE)
