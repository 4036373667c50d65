"""ADE20K (SceneParsing 150): its class names, palette and DataModule.

The layout, pairing and augmentation are the generic segmentation ones (`segmentation.py`);
ADE20K's label maps hold 0 for "other" (unlabelled) and 1..150 for the classes, which
`reduce_zero_label` turns into the ignore index and 0..149, as mmsegmentation does.
"""

from __future__ import annotations

from vitdense.data.base import LoaderConfig, Triple
from vitdense.data.segmentation import SEGMENTATION_LOADER, SegmentationDataModule

#: The 150 classes of ADEChallengeData2016 in label order (label map value k + 1 is class k),
#: as in mmsegmentation's `ADE20KDataset.METAINFO` (whose "bed " carries a stray trailing space,
#: dropped here).
# fmt: off
ADE20K_CLASSES: tuple[str, ...] = (
    "wall", "building", "sky", "floor", "tree", "ceiling", "road", "bed", "windowpane", "grass", "cabinet",
    "sidewalk", "person", "earth", "door", "table", "mountain", "plant", "curtain", "chair", "car", "water",
    "painting", "sofa", "shelf", "house", "sea", "mirror", "rug", "field", "armchair", "seat", "fence", "desk",
    "rock", "wardrobe", "lamp", "bathtub", "railing", "cushion", "base", "box", "column", "signboard",
    "chest of drawers", "counter", "sand", "sink", "skyscraper", "fireplace", "refrigerator", "grandstand", "path",
    "stairs", "runway", "case", "pool table", "pillow", "screen door", "stairway", "river", "bridge", "bookcase",
    "blind", "coffee table", "toilet", "flower", "book", "hill", "bench", "countertop", "stove", "palm",
    "kitchen island", "computer", "swivel chair", "boat", "bar", "arcade machine", "hovel", "bus", "towel", "light",
    "truck", "tower", "chandelier", "awning", "streetlight", "booth", "television receiver", "airplane",
    "dirt track", "apparel", "pole", "land", "bannister", "escalator", "ottoman", "bottle", "buffet", "poster",
    "stage", "van", "ship", "fountain", "conveyer belt", "canopy", "washer", "plaything", "swimming pool", "stool",
    "barrel", "basket", "waterfall", "tent", "bag", "minibike", "cradle", "oven", "ball", "food", "step", "tank",
    "trade name", "microwave", "pot", "animal", "bicycle", "lake", "dishwasher", "screen", "blanket", "sculpture",
    "hood", "sconce", "vase", "traffic light", "tray", "ashcan", "fan", "pier", "crt screen", "plate", "monitor",
    "bulletin board", "shower", "radiator", "glass", "clock", "flag",
)

#: mmsegmentation's RGB colour per class, for overlays (road and skyscraper share (140, 140, 140)).
ADE20K_PALETTE: tuple[tuple[int, int, int], ...] = (
    (120, 120, 120), (180, 120, 120), (6, 230, 230), (80, 50, 50), (4, 200, 3), (120, 120, 80), (140, 140, 140),
    (204, 5, 255), (230, 230, 230), (4, 250, 7), (224, 5, 255), (235, 255, 7), (150, 5, 61), (120, 120, 70),
    (8, 255, 51), (255, 6, 82), (143, 255, 140), (204, 255, 4), (255, 51, 7), (204, 70, 3), (0, 102, 200),
    (61, 230, 250), (255, 6, 51), (11, 102, 255), (255, 7, 71), (255, 9, 224), (9, 7, 230), (220, 220, 220),
    (255, 9, 92), (112, 9, 255), (8, 255, 214), (7, 255, 224), (255, 184, 6), (10, 255, 71), (255, 41, 10),
    (7, 255, 255), (224, 255, 8), (102, 8, 255), (255, 61, 6), (255, 194, 7), (255, 122, 8), (0, 255, 20),
    (255, 8, 41), (255, 5, 153), (6, 51, 255), (235, 12, 255), (160, 150, 20), (0, 163, 255), (140, 140, 140),
    (250, 10, 15), (20, 255, 0), (31, 255, 0), (255, 31, 0), (255, 224, 0), (153, 255, 0), (0, 0, 255),
    (255, 71, 0), (0, 235, 255), (0, 173, 255), (31, 0, 255), (11, 200, 200), (255, 82, 0), (0, 255, 245),
    (0, 61, 255), (0, 255, 112), (0, 255, 133), (255, 0, 0), (255, 163, 0), (255, 102, 0), (194, 255, 0),
    (0, 143, 255), (51, 255, 0), (0, 82, 255), (0, 255, 41), (0, 255, 173), (10, 0, 255), (173, 255, 0),
    (0, 255, 153), (255, 92, 0), (255, 0, 255), (255, 0, 245), (255, 0, 102), (255, 173, 0), (255, 0, 20),
    (255, 184, 184), (0, 31, 255), (0, 255, 61), (0, 71, 255), (255, 0, 204), (0, 255, 194), (0, 255, 82),
    (0, 10, 255), (0, 112, 255), (51, 0, 255), (0, 194, 255), (0, 122, 255), (0, 255, 163), (255, 153, 0),
    (0, 255, 10), (255, 112, 0), (143, 255, 0), (82, 0, 255), (163, 255, 0), (255, 235, 0), (8, 184, 170),
    (133, 0, 255), (0, 255, 92), (184, 0, 255), (255, 0, 31), (0, 184, 255), (0, 214, 255), (255, 0, 112),
    (92, 255, 0), (0, 224, 255), (112, 224, 255), (70, 184, 160), (163, 0, 255), (153, 0, 255), (71, 255, 0),
    (255, 0, 163), (255, 204, 0), (255, 0, 143), (0, 255, 235), (133, 255, 0), (255, 0, 235), (245, 0, 255),
    (255, 0, 122), (255, 245, 0), (10, 190, 212), (214, 255, 0), (0, 204, 255), (20, 0, 255), (255, 255, 0),
    (0, 153, 255), (0, 41, 255), (0, 255, 204), (41, 0, 255), (41, 255, 0), (173, 0, 255), (0, 245, 255),
    (71, 0, 255), (122, 0, 255), (0, 255, 184), (0, 92, 255), (184, 255, 0), (0, 133, 255), (255, 214, 0),
    (25, 194, 194), (102, 255, 0), (92, 0, 255),
)
# fmt: on


class ADE20KDataModule(SegmentationDataModule):
    """ADE20K's SceneParsing benchmark (ADEChallengeData2016): 150 classes, 20210 training
    and 2000 validation images, with mmseg/Segmenter's augmentation.

    Label 0 ("other") is ignored and 1..150 become 0..149 (`ADE20K_CLASSES`). `test` runs
    on the validation split, where published results are measured. Download,
    check and extract the data with `python data_scripts/ade20k.py`.

    Args:
        root: the extracted ADEChallengeData2016 folder.
        Others: see `SegmentationDataModule`.
    """

    palette = ADE20K_PALETTE
    layout_help = (
        "expected ADE20K's extracted ADEChallengeData2016 folder, holding images/{training,validation}/*.jpg and "
        "annotations/{training,validation}/*.png; download and extract it with data_scripts/ade20k.py "
        "(see data_scripts/), or point data.init_args.root at it"
    )

    def __init__(
        self,
        *,
        root: str = "data/ade/ADEChallengeData2016",
        crop_size: int = 512,
        scale: tuple[int, int] = (2048, 512),
        ratio_range: tuple[float, float] = (0.5, 2.0),
        cat_max_ratio: float = 0.75,
        eval_short_side: int = 512,
        train_split: str = "training",
        val_split: str = "validation",
        loader: LoaderConfig = SEGMENTATION_LOADER,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        predict_dir: str | None = None,
    ) -> None:
        # the class names, the label reduction and the test split are ADE20K's; the base
        # records only the arguments above, so that a checkpoint rebuilds this class
        super().__init__(
            root=root,
            class_names=list(ADE20K_CLASSES),
            reduce_zero_label=True,  # 0 is "other"
            crop_size=crop_size,
            scale=scale,
            ratio_range=ratio_range,
            cat_max_ratio=cat_max_ratio,
            eval_short_side=eval_short_side,
            train_split=train_split,
            val_split=val_split,
            test_split=val_split,  # ADE20K's labelled benchmark split: published mIoUs are on validation
            loader=loader,
            backbone=backbone,
            mean=mean,
            std=std,
            predict_dir=predict_dir,
        )
