"""Datasets, transforms and DataModules."""

from vitdense.data.ade20k import ADE20K_CLASSES, ADE20K_PALETTE, ADE20KDataModule
from vitdense.data.base import ImageDataModule, LoaderConfig, image_dataloader
from vitdense.data.cifar import CIFAR10_CLASSES, CIFAR100_CLASSES, CIFARDataModule, CIFARImages
from vitdense.data.classification import ClassificationDataModule
from vitdense.data.coco import COCODataModule, load_coco
from vitdense.data.collate import pad_collate
from vitdense.data.det_transforms import detection_eval_transforms, detection_train_transforms
from vitdense.data.detection import CocoDetection, DetectionDataModule
from vitdense.data.imagefolder import ImageFolderDataModule, ImageFolderDataset, find_classes
from vitdense.data.images import ImageFiles, decode_image, find_images
from vitdense.data.seg_transforms import segmentation_eval_transforms, segmentation_train_transforms
from vitdense.data.segmentation import SegmentationDataModule, SegmentationFolderDataset
from vitdense.data.synthetic import SyntheticClassificationDataModule, SyntheticShapes
from vitdense.data.synthetic_det import SyntheticDetectionDataModule, write_synthetic_coco
from vitdense.data.synthetic_seg import SyntheticSegmentation, SyntheticSegmentationDataModule
from vitdense.data.transforms import (
    classification_eval_transforms,
    classification_train_transforms,
    normalization,
    seed_worker_transforms,
)
from vitdense.data.unlabeled import UnlabeledImages, UnlabeledImagesDataModule
from vitdense.types import DetectedImages, LabeledImages, SegmentedImages

__all__ = [
    "ADE20K_CLASSES",
    "ADE20K_PALETTE",
    "CIFAR10_CLASSES",
    "CIFAR100_CLASSES",
    "ADE20KDataModule",
    "ClassificationDataModule",
    "COCODataModule",
    "CocoDetection",
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
    "SegmentationDataModule",
    "SegmentationFolderDataset",
    "SegmentedImages",
    "SyntheticClassificationDataModule",
    "SyntheticDetectionDataModule",
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
    "find_classes",
    "find_images",
    "normalization",
    "pad_collate",
    "seed_worker_transforms",
    "segmentation_eval_transforms",
    "segmentation_train_transforms",
    "write_synthetic_coco",
]
