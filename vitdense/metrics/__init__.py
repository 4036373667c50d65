"""Dataset-level metrics, one module per family: semantic segmentation with mmseg's definitions
(`.segmentation`), COCO's box mAP (`.detection`), COCO's keypoint AP (`.keypoints`), panoptic
quality and mask AP (`.universal`), depth's error and accuracy measures (`.depth`), the mean
evaluation loss and the gathering of per-image states across processes (`.common`).

Every name is imported on first use (PEP 562): importing one family's module does not import
the others.
"""

from __future__ import annotations

from vitdense.core.moved import lazy_exports

#: each public name and the module that defines it
_WHERE = {
    "WeightedMean": "vitdense.metrics.common",
    "LossMeans": "vitdense.metrics.common",
    "WholeListGather": "vitdense.metrics.common",
    "SegmentationMetrics": "vitdense.metrics.segmentation",
    "COCO_IOU_THRESHOLDS": "vitdense.metrics.detection",
    "COCO_REC_THRESHOLDS": "vitdense.metrics.detection",
    "DetectionMeanAP": "vitdense.metrics.detection",
    "KEYPOINT_AP_KEYS": "vitdense.metrics.keypoints",
    "KeypointMeanAP": "vitdense.metrics.keypoints",
    "evaluate_keypoints": "vitdense.metrics.keypoints",
    "PQ_KEYS": "vitdense.metrics.universal",
    "PanopticQuality": "vitdense.metrics.universal",
    "InstanceMeanAP": "vitdense.metrics.universal",
    "instance_ap_inputs": "vitdense.metrics.universal",
    "DEPTH_METRIC_NAMES": "vitdense.metrics.depth",
    "EIGEN_CROP": "vitdense.metrics.depth",
    "garg_crop": "vitdense.metrics.depth",
    "DepthMetrics": "vitdense.metrics.depth",
}

__all__ = sorted(_WHERE)

__getattr__ = lazy_exports(__name__, _WHERE)
