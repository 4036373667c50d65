"""Keypoints as datasets write them, read into one `KeypointSchema` and [K, 3] arrays.

COCO's keypoint JSON (`person_keypoints_*.json`) names the K keypoints and their skeleton
(1-based pairs) in its categories, and gives each annotation K (x, y, v) triplets, v = 0 not
labelled, 1 labelled but not visible, 2 visible. This module reads the categories into a
schema (`coco_keypoint_schema`: the flips from the names' `left_` / `right_` prefixes,
COCOeval's sigmas when the names are COCO's 17), checks each annotation's triplets
(`annotation_keypoints`) and applies the user's overrides of sigmas and flips
(`override_schema`). YOLO-pose folders are read into the same COCO JSON by
`vitdense.data.yolo`, so both formats meet here.

Coordinates are COCO's and the boxes' alike: absolute pixels of the image as stored, x
running over [0, W] (pixel i covers [i, i + 1)); a keypoint that is not labelled is
(0, 0, 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from vitdense.core.errors import DataError
from vitdense.types.keypoints import COCO_PERSON, KeypointSchema

#: the name prefixes of keypoints that trade places in a horizontally flipped image
MIRRORED_PREFIXES = ("left_", "right_")
VISIBILITIES = (0, 1, 2)
#: what a visibility error says is expected
VISIBILITY_RULE = "expected 0 (not labelled), 1 (labelled, not visible) or 2 (labelled and visible)"


def first_bad_visibility(v: np.ndarray) -> int | None:
    """The index of the first visibility [K] that is not 0, 1 or 2, or None."""
    wrong = np.flatnonzero(~np.isin(v, VISIBILITIES))
    return int(wrong[0]) if len(wrong) else None


def flip_index_from_names(names: Sequence[str]) -> tuple[int, ...]:
    """For each keypoint, the index of its mirror image: `left_x` <-> `right_x` when both are
    named (COCO's naming), else itself."""
    left, right = MIRRORED_PREFIXES
    position = {name: i for i, name in enumerate(names)}
    flip = []
    for i, name in enumerate(names):
        if name.startswith(left):
            mate = right + name[len(left) :]
        elif name.startswith(right):
            mate = left + name[len(right) :]
        else:
            mate = name
        flip.append(position.get(mate, i))
    return tuple(flip)


def default_sigmas(names: Sequence[str]) -> tuple[float, ...] | None:
    """COCOeval's person sigmas when `names` are COCO's 17 person keypoints in COCO's order,
    else None: another dataset's constants are its own to give."""
    return COCO_PERSON.sigmas if tuple(names) == COCO_PERSON.names else None


def schema_from_names(
    names: Sequence[str],
    skeleton: Sequence[Sequence[int]] = (),
    flip_index: Sequence[int] | None = None,
    sigmas: Sequence[float] | None = None,
    where: str = "",
) -> KeypointSchema:
    """A `KeypointSchema` of `names` (0-based `skeleton`), its flips and sigmas from the names
    unless given; an invalid one is a `DataError` that starts with `where`."""
    try:
        return KeypointSchema(
            tuple(str(n) for n in names),
            tuple(tuple(pair) for pair in skeleton),
            tuple(flip_index) if flip_index is not None else flip_index_from_names(names),
            tuple(sigmas) if sigmas is not None else default_sigmas(names),
        )
    except (ValueError, TypeError) as err:
        raise DataError(f"{where}: {err}") from err


def coco_keypoint_schema(categories: list[dict[str, Any]], path: Path) -> tuple[KeypointSchema | None, set[int]]:
    """(the schema of the categories that list `keypoints`, their ids); (None, {}) when none
    does. Those categories must list the same names and skeleton: one schema per dataset."""
    schema, first, ids = None, "", set()
    for i, cat in enumerate(categories):
        names = cat.get("keypoints")
        if not names:  # absent or [] (a category without keypoints in a keypoint file)
            continue
        where = f"{path}: categories[{i}] (id {cat['id']})"
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise DataError(f"{where} has keypoints {names!r}; expected the list of keypoint names")
        skeleton = cat.get("skeleton") or []
        if not isinstance(skeleton, list) or not all(_is_pair(p, 1, len(names)) for p in skeleton):
            raise DataError(
                f"{where} has skeleton {skeleton!r}; expected pairs of keypoint numbers 1..{len(names)} (COCO's "
                "skeleton is 1-based)"
            )
        this = schema_from_names(names, [(a - 1, b - 1) for a, b in skeleton], where=where)
        if schema is not None and (this.names, this.skeleton) != (schema.names, schema.skeleton):
            raise DataError(
                f"{where} lists keypoints {list(this.names)} (skeleton {list(this.skeleton)}) but {first} lists "
                f"{list(schema.names)} (skeleton {list(schema.skeleton)}); every category whose annotations carry "
                "keypoints must share one schema: give them the same 'keypoints' and 'skeleton', or split the dataset"
            )
        schema, first = schema or this, first or f"categories[{i}] (id {cat['id']})"
        ids.add(cat["id"])
    return schema, ids


def _is_pair(pair: Any, low: int, high: int) -> bool:
    return (
        isinstance(pair, list | tuple)
        and len(pair) == 2
        and all(isinstance(i, int) and not isinstance(i, bool) and low <= i <= high for i in pair)
    )


def annotation_keypoints(ann: dict[str, Any], schema: KeypointSchema, where: str) -> np.ndarray:
    """The [K, 3] float32 (x, y, v) of the COCO annotation `ann` (named `where` in messages),
    checked; all 0 when it has no `keypoints`. A point that is not labelled becomes (0, 0, 0).

    Raises `DataError` on: a `keypoints` list that is not 3 x K numbers, a non-finite value, a
    visibility not in {0, 1, 2}, a crowd with labelled keypoints, `num_keypoints` that is not
    the count of labelled (v > 0) keypoints.
    """
    k = schema.num_keypoints
    values = ann.get("keypoints")
    if values is None or values == []:  # a box without keypoints (num_keypoints 0)
        points = np.zeros((k, 3))
    else:
        numbers = isinstance(values, list) and all(isinstance(v, int | float) for v in values)
        if not numbers or len(values) != 3 * k:
            size = len(values) if isinstance(values, list) else type(values).__name__
            raise DataError(
                f"{where} has {size} keypoint values; expected 3 x {k} = {3 * k} numbers (x, y, v for each of "
                f"the {k} keypoints its category lists)"
            )
        bad = [j for j, v in enumerate(values) if not math.isfinite(v)]
        if bad:
            raise DataError(
                f"{where} has a non-finite keypoint value {values[bad[0]]} (keypoint {bad[0] // 3}, "
                f"{schema.names[bad[0] // 3]}); give finite pixel coordinates, or 0, 0, 0 for a keypoint not labelled"
            )
        points = np.asarray(values, dtype=np.float64).reshape(k, 3)
        if (j := first_bad_visibility(points[:, 2])) is not None:
            raise DataError(
                f"{where} gives keypoint {j} ({schema.names[j]}) visibility {values[3 * j + 2]}; {VISIBILITY_RULE}"
            )
    labelled = int((points[:, 2] > 0).sum())
    count = ann.get("num_keypoints")
    if ann.get("iscrowd", 0) and (labelled or count):
        raise DataError(
            f"{where} is a crowd region (iscrowd 1) with labelled keypoints (num_keypoints {count}, {labelled} with "
            "v > 0); a crowd has none: set its keypoints to 0 (and num_keypoints 0), or annotate the person "
            "with iscrowd 0"
        )
    if count is not None and count != labelled:
        raise DataError(
            f"{where} has num_keypoints {count} but {labelled} keypoints with v > 0; num_keypoints must count the "
            "labelled keypoints"
        )
    points[points[:, 2] == 0, :2] = 0
    return points.astype(np.float32)


def override_schema(
    schema: KeypointSchema | None,
    sigmas: Sequence[float] | None,
    flip_index: Sequence[int] | None,
    source: str,
) -> KeypointSchema | None:
    """`schema` with the user's `sigmas` and `flip_index` (DataModule arguments
    `keypoint_sigmas`, `flip_index`) in place of the dataset's; `source` names the dataset in
    the error a dataset without keypoints gives."""
    if sigmas is None and flip_index is None:
        return schema
    given = "data.init_args.keypoint_sigmas" if sigmas is not None else "data.init_args.flip_index"
    if schema is None:
        raise DataError(
            f"{given} is set but {source} has no keypoints (its categories list no keypoint names); drop {given}"
        )
    try:
        return replace(
            schema,
            sigmas=schema.sigmas if sigmas is None else tuple(float(s) for s in sigmas),
            flip_index=schema.flip_index if flip_index is None else tuple(int(i) for i in flip_index),
        )
    except ValueError as err:
        raise DataError(f"data.init_args.keypoint_sigmas / flip_index for {source}: {err}") from err
