"""Datasets, transforms and DataModules.

Every name here is imported on first use (PEP 562), so that importing one module of the
package (`vitdense.data.images`, `vitdense.data.collate`) does not import every dataset
family and albumentations: `vitdense.load` reads images and pads batches with those two
alone.
"""

from __future__ import annotations

import importlib
from typing import Any

#: each public name and the module that defines it
_WHERE = {
    "ADE20K_CLASSES": "vitdense.data.ade20k",
    "ADE20K_PALETTE": "vitdense.data.ade20k",
    "ADE20KDataModule": "vitdense.data.ade20k",
    "ImageDataModule": "vitdense.data.base",
    "LoaderConfig": "vitdense.data.base",
    "image_dataloader": "vitdense.data.base",
    "CIFAR10_CLASSES": "vitdense.data.cifar",
    "CIFAR100_CLASSES": "vitdense.data.cifar",
    "CIFARDataModule": "vitdense.data.cifar",
    "CIFARImages": "vitdense.data.cifar",
    "ClassificationDataModule": "vitdense.data.classification",
    "COCODataModule": "vitdense.data.coco",
    "load_coco": "vitdense.data.coco_json",
    "CocoInstanceMaskDataModule": "vitdense.data.coco_panoptic",
    "CocoPanopticDataModule": "vitdense.data.coco_panoptic",
    "CocoSegments": "vitdense.data.coco_panoptic",
    "CocoSegmentsDataModule": "vitdense.data.coco_panoptic",
    "load_coco_instance_masks": "vitdense.data.coco_panoptic",
    "load_coco_panoptic": "vitdense.data.coco_panoptic",
    "pad_collate": "vitdense.data.collate",
    "detection_eval_transforms": "vitdense.data.det_transforms",
    "detection_train_transforms": "vitdense.data.det_transforms",
    "CocoDetection": "vitdense.data.detection",
    "DetectionDataModule": "vitdense.data.detection",
    "ImageFolderDataModule": "vitdense.data.imagefolder",
    "ImageFolderDataset": "vitdense.data.imagefolder",
    "find_classes": "vitdense.data.imagefolder",
    "ImageFiles": "vitdense.data.images",
    "panoptic_eval_transforms": "vitdense.data.panoptic_transforms",
    "panoptic_train_transforms": "vitdense.data.panoptic_transforms",
    "decode_image": "vitdense.data.images",
    "find_images": "vitdense.data.images",
    "segmentation_eval_transforms": "vitdense.data.seg_transforms",
    "segmentation_train_transforms": "vitdense.data.seg_transforms",
    "SegmentationDataModule": "vitdense.data.segmentation",
    "SegmentationFolderDataset": "vitdense.data.segmentation",
    "SyntheticClassificationDataModule": "vitdense.data.synthetic",
    "SyntheticShapes": "vitdense.data.synthetic",
    "SyntheticDetectionDataModule": "vitdense.data.synthetic_det",
    "SyntheticPanopticDataModule": "vitdense.data.synthetic_panoptic",
    "write_synthetic_panoptic": "vitdense.data.synthetic_panoptic",
    "write_synthetic_coco": "vitdense.data.synthetic_det",
    "SyntheticSegmentation": "vitdense.data.synthetic_seg",
    "SyntheticSegmentationDataModule": "vitdense.data.synthetic_seg",
    "classification_eval_transforms": "vitdense.data.cls_transforms",
    "classification_train_transforms": "vitdense.data.cls_transforms",
    "normalization": "vitdense.data.transforms",
    "seed_worker_transforms": "vitdense.data.transforms",
    "UnlabeledImages": "vitdense.data.unlabeled",
    "UnlabeledImagesDataModule": "vitdense.data.unlabeled",
    "DetectedImages": "vitdense.types",
    "LabeledImages": "vitdense.types",
    "PanopticImages": "vitdense.types",
    "SegmentedImages": "vitdense.types",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'vitdense.data' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "ADE20K_CLASSES",
    "ADE20K_PALETTE",
    "CIFAR10_CLASSES",
    "CIFAR100_CLASSES",
    "ADE20KDataModule",
    "ClassificationDataModule",
    "COCODataModule",
    "CocoDetection",
    "CocoInstanceMaskDataModule",
    "CocoPanopticDataModule",
    "CocoSegments",
    "CocoSegmentsDataModule",
    "DetectedImages",
    "DetectionDataModule",
    "ImageDataModule",
    "image_dataloader",
    "CIFARDataModule",
    "CIFARImages",
    "ImageFiles",
    "ImageFolderDataModule",
    "ImageFolderDataset",
    "LabeledImages",
    "LoaderConfig",
    "PanopticImages",
    "SegmentationDataModule",
    "SegmentationFolderDataset",
    "SegmentedImages",
    "SyntheticClassificationDataModule",
    "SyntheticDetectionDataModule",
    "SyntheticPanopticDataModule",
    "SyntheticSegmentation",
    "SyntheticSegmentationDataModule",
    "SyntheticShapes",
    "UnlabeledImages",
    "UnlabeledImagesDataModule",
    "classification_eval_transforms",
    "classification_train_transforms",
    "decode_image",
    "detection_eval_transforms",
    "detection_train_transforms",
    "load_coco",
    "load_coco_instance_masks",
    "load_coco_panoptic",
    "find_classes",
    "find_images",
    "normalization",
    "pad_collate",
    "panoptic_eval_transforms",
    "panoptic_train_transforms",
    "seed_worker_transforms",
    "segmentation_eval_transforms",
    "segmentation_train_transforms",
    "write_synthetic_coco",
    "write_synthetic_panoptic",
]
