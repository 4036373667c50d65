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
      MultiTaskModel    -> {name: each model's output}, the shared encoder run once


One module per family (`vitdense.models.classification`, `.segmentation`, `.detection`,
`.universal`, `.depth`, `.pretrain`, `.multitask`), sliding-window inference in `vitdense.models.windows`.

How each predicts without its task is a small frozen dataclass of plain settings beside it
(`ClassifierInference`, `LinearProbeInference`, `SegmenterInference`, `DetectorInference`,
`EoMTInference`, `DPTInference`, `MaskedImageInference`): a built-in task records its own in
every checkpoint (`vitdense.deploy.checkpoint.record_model`: its dotted path and fields, with
the backbone's settings and the head's factory as plain data), and `vitdense.load`,
`load_model`, `export` and `serve` rebuild the model and predict from it without importing
the task (nor Lightning). Each has

    build(backbone, head_factory) -> the model      (the task's own construction, weights next)
    sample(image, size, index)    -> the sample an image becomes (the task's `predict_sample`)
    predict(model, batch)         -> what the task's `predict_step` returns for the batch
    result_type                   -> what a prediction becomes (`vitdense.results`; None: none)

Every name is imported on first use (PEP 562): importing one family's module does not import
the others.
"""

from __future__ import annotations

from vitdense.core.moved import lazy_exports

#: each public name and the module that defines it
_WHERE = {
    "ImageClassifier": "vitdense.models.classification",
    "LinearProbe": "vitdense.models.classification",
    "top_k_prediction": "vitdense.models.classification",
    "ClassifierInference": "vitdense.models.classification",
    "LinearProbeInference": "vitdense.models.classification",
    "Segmenter": "vitdense.models.segmentation",
    "SegmenterInference": "vitdense.models.segmentation",
    "Selection": "vitdense.models.detection",
    "postprocess": "vitdense.models.detection",
    "DETRDetector": "vitdense.models.detection",
    "DetectorInference": "vitdense.models.detection",
    "semantic_inference": "vitdense.models.universal",
    "panoptic_inference": "vitdense.models.universal",
    "instance_inference": "vitdense.models.universal",
    "EoMT": "vitdense.models.universal",
    "EoMTInference": "vitdense.models.universal",
    "DepthOutputKind": "vitdense.models.depth",
    "DPT": "vitdense.models.depth",
    "DPTInference": "vitdense.models.depth",
    "MaskedImageModel": "vitdense.models.pretrain",
    "MaskedImageInference": "vitdense.models.pretrain",
    "MultiTaskModel": "vitdense.models.multitask",
    "Predict": "vitdense.models.windows",
    "window_starts": "vitdense.models.windows",
    "slide_inference": "vitdense.models.windows",
    "segment_image": "vitdense.models.windows",
    "segment_batch": "vitdense.models.windows",
}

__all__ = sorted(_WHERE)

__getattr__ = lazy_exports(__name__, _WHERE)
