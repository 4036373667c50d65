"""COCO-format detection data as a DataModule (`COCODataModule`): COCO 2017, or anyone's
own images + COCO JSON in COCO's layout, with or without keypoints. The format itself
(reading and checking the JSON, writing results) is `vitdense.data.coco_json`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vitdense.core.errors import DataError
from vitdense.data.base import LoaderConfig, Triple

# (CocoIndex and load_coco are re-exported: they lived here)
from vitdense.data.coco_json import LAYOUT, CocoIndex, load_coco, read_categories, read_header  # noqa: F401
from vitdense.data.detection import DetectionDataModule
from vitdense.data.keypoints import override_schema
from vitdense.data.transforms.detection import DETR_SCALES

if TYPE_CHECKING:
    from vitdense.types.keypoints import KeypointSchema

#: DETR's 2 images per GPU
COCO_LOADER = LoaderConfig(batch_size=2)


class COCODataModule(DetectionDataModule):
    """COCO 2017, or any dataset in its layout (images + COCO JSON per split).

    The class count and names come from the validation JSON's categories, read at
    construction so that the CLI can give them to the task; so does `keypoint_schema` for a
    keypoint JSON (`person_keypoints_*.json`: categories with `keypoints` and `skeleton`),
    whose samples then carry keypoints (`CocoDetection`). Every split must list the same
    categories and keypoints.

    Args:
        root: dataset folder.
        train_images, val_images, test_images: image folders under `root` (test: the
            validation split unless given).
        train_annotations, val_annotations, test_annotations: COCO JSON files under `root`.
        categories: {category id: name}; None: the validation JSON's (a checkpoint records
            them, so that predicting on a folder of images needs no annotations). When
            given, every split's JSON must list the same.
        keypoint_sigmas: the K OKS sigmas of a keypoint dataset, in place of the JSON's
            (COCOeval's person sigmas when its keypoints are COCO's 17, else none: keypoint
            AP needs them).
        flip_index: for each keypoint, the index of its mirror image in a flipped image, in
            place of the one the names give (`left_x` <-> `right_x`, others unchanged).
        img_size, scales, max_size, crop_scales, crop_size, eval_short_side, square_resize:
            see `DetectionDataModule`.
        loader, backbone, mean, std, predict_dir: see `ImageDataModule`.
    """

    def __init__(
        self,
        *,
        root: str = "data/coco",
        train_images: str = "train2017",
        train_annotations: str = "annotations/instances_train2017.json",
        val_images: str = "val2017",
        val_annotations: str = "annotations/instances_val2017.json",
        test_images: str | None = None,
        test_annotations: str | None = None,
        categories: dict[int, str] | None = None,
        keypoint_sigmas: list[float] | None = None,
        flip_index: list[int] | None = None,
        img_size: int = 224,
        scales: list[int] = list(DETR_SCALES),  # noqa: B006 (jsonargparse reads the default)
        max_size: int | None = 1333,
        crop_scales: list[int] = [400, 500, 600],  # noqa: B006
        crop_size: tuple[int, int] = (384, 600),
        eval_short_side: int = 800,
        square_resize: bool = False,
        loader: LoaderConfig = COCO_LOADER,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        predict_dir: str | None = None,
    ) -> None:
        super().__init__(
            img_size=img_size,
            scales=scales,
            max_size=max_size,
            crop_scales=crop_scales,
            crop_size=crop_size,
            eval_short_side=eval_short_side,
            square_resize=square_resize,
            loader=loader,
            backbone=backbone,
            mean=mean,
            std=std,
            predict_dir=predict_dir,
        )
        self.root = Path(root)
        self.splits = {
            "train": (train_images, train_annotations),
            "val": (val_images, val_annotations),
            "test": (test_images or val_images, test_annotations or val_annotations),
        }
        self.keypoint_sigmas, self.flip_index = keypoint_sigmas, flip_index
        if categories is None:
            self.category_ids, self.class_names = self.read_categories()
        else:
            self.category_ids, self.class_names = [int(c) for c in categories], list(categories.values())
        self.num_classes = len(self.class_names)
        # a checkpoint records the categories: it predicts on a folder without the JSON
        self.record(categories=dict(zip(self.category_ids, self.class_names, strict=True)))
        self.indexes: dict[str, CocoIndex] = {}

    def annotation_path(self, split: str) -> Path:
        return self.root / self.splits[split][1]

    def read_categories(self) -> tuple[list[int], list[str]]:
        """The dataset's categories, from the validation JSON (and its `keypoint_schema`, read
        with them)."""
        path = self.annotation_path("val")
        if not path.is_file():
            raise FileNotFoundError(
                f"{path}: COCO annotations not found; expected layout {LAYOUT} "
                "(COCO 2017: download, check and extract it with `python data_scripts/coco.py --out "
                f"{self.root}`), or point data.init_args.root at your dataset"
            )
        ids, names, schema = read_header(path)
        self.keypoint_schema = override_schema(schema, self.keypoint_sigmas, self.flip_index, str(path))
        return ids, names

    @property
    def train_location(self) -> str:
        return str(self.annotation_path("train"))

    def index(self, split: str) -> CocoIndex:
        """The split's checked JSON (read once); its categories and keypoints must be the
        validation set's."""
        if split not in self.indexes:
            images, _ = self.splits[split]
            index = load_coco(self.annotation_path(split), self.root / images)
            if index.category_ids != self.category_ids:
                raise DataError(
                    f"{index.annotation_file}: its categories differ from {self.annotation_path('val')}'s; "
                    "every split must list the same categories"
                )
            index.keypoint_schema = override_schema(
                index.keypoint_schema, self.keypoint_sigmas, self.flip_index, str(index.annotation_file)
            )
            if self.keypoint_schema is None:
                self.keypoint_schema = index.keypoint_schema
            elif index.keypoint_schema != self.keypoint_schema:
                raise DataError(
                    f"{index.annotation_file}: its keypoints ({_described(index.keypoint_schema)}) differ from "
                    f"{self.annotation_path('val')}'s ({_described(self.keypoint_schema)}); every split must list "
                    "the same keypoints"
                )
            self.indexes[split] = index
        return self.indexes[split]


def _described(schema: KeypointSchema | None) -> str:
    return "none" if schema is None else f"{schema.num_keypoints}: {', '.join(schema.names)}"
