"""Generated datasets for every family, one module each (`classification`, `segmentation`,
`detection`, `universal`, `depth`, `multitask`: co-annotated scenes, `keypoints`: stick figures): the demos' and the
tests' data, written in the real on-disk layouts where a family reads files (COCO JSON, COCO panoptic PNGs, depth PNGs,
COCO keypoints)."""

from __future__ import annotations

from typing import Any

from vitdense.core.moved import moved_attribute

#: the names of the module this package replaced (until the next release)
_FORMERLY_HERE = {
    "_logger": "vitdense.data.synthetic.classification",
    "WrittenOnFirstUse": "vitdense.data.synthetic.classification",
    "SHAPES": "vitdense.data.synthetic.classification",
    "draw_shape": "vitdense.data.synthetic.classification",
    "textured_background": "vitdense.data.synthetic.classification",
    "SyntheticShapes": "vitdense.data.synthetic.classification",
    "SYNTHETIC_LOADER": "vitdense.data.synthetic.classification",
    "SyntheticClassificationDataModule": "vitdense.data.synthetic.classification",
    "split_seed": "vitdense.data.synthetic.classification",
}


def __getattr__(name: str) -> Any:
    return moved_attribute(__name__, _FORMERLY_HERE, name)
