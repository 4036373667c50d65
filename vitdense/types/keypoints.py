"""Keypoints: what a dataset declares about its K named points (`KeypointSchema`), and COCO's
17 person keypoints (`COCO_PERSON`).

Keypoints travel with the boxes they belong to (`BoxTargets.keypoints`,
`EvalTargets.keypoints`, `Detections.keypoints`), as [n, K, 3] triplets (x, y, v) in COCO's
convention: v = 0 not labelled (x = y = 0), 1 labelled but not visible, 2 labelled and
visible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: what a keypoint head predicts per keypoint (`DetectionOutput.keypoints`): x, y, findable
#: logit, visible logit, log l11, l21, log l22 (`vitdense.losses.keypoints`)
KEYPOINT_CHANNELS = 7

#: pycocotools' `Params.kpt_oks_sigmas` for COCO's 17 person keypoints (COCOeval's defaults)
COCO_PERSON_SIGMAS = (
    0.026, 0.025, 0.025, 0.035, 0.035, 0.079, 0.079, 0.072, 0.072, 0.062, 0.062, 0.107, 0.107, 0.087, 0.087, 0.089, 0.089,
)  # fmt: skip


@dataclass(frozen=True)
class KeypointSchema:
    """The K keypoints of a dataset's objects.

    Attributes:
        names: the K keypoint names, in the annotations' order.
        skeleton: pairs of keypoint indices (0-based) joined when drawn (COCO's JSON lists
            them 1-based; readers convert).
        flip_index: for each keypoint, the one it becomes in a horizontally flipped image
            (Ultralytics' `flip_idx`; COCO: left <-> right); the identity when nothing swaps.
        sigmas: the per-keypoint OKS constants (COCOeval's `kpt_oks_sigmas`), or None when the
            dataset gives none: keypoint AP is then refused rather than computed with
            someone else's constants.
    """

    names: tuple[str, ...]
    skeleton: tuple[tuple[int, int], ...] = ()
    flip_index: tuple[int, ...] | None = None
    sigmas: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        k = len(self.names)
        if k == 0:
            raise ValueError("KeypointSchema: no keypoint names")
        if len(set(self.names)) != k:
            raise ValueError(f"KeypointSchema: keypoint names repeat: {list(self.names)}")
        flip = tuple(range(k)) if self.flip_index is None else tuple(int(i) for i in self.flip_index)
        if sorted(flip) != list(range(k)) or any(flip[flip[i]] != i for i in range(k)):
            raise ValueError(
                f"KeypointSchema: flip_index {list(flip)} is not a pairing of the {k} keypoints (each index once, "
                "and i -> j -> i): list, for each keypoint, the index of its mirror image (itself if it has none)"
            )
        object.__setattr__(self, "flip_index", flip)
        bad = [pair for pair in self.skeleton if len(pair) != 2 or not all(0 <= int(i) < k for i in pair)]
        if bad:
            raise ValueError(f"KeypointSchema: skeleton pairs {bad} are not pairs of keypoint indices 0..{k - 1}")
        object.__setattr__(self, "skeleton", tuple((int(a), int(b)) for a, b in self.skeleton))
        if self.sigmas is not None:
            if len(self.sigmas) != k or any(not s > 0 for s in self.sigmas):
                raise ValueError(f"KeypointSchema: {len(self.sigmas)} sigmas for {k} keypoints; expected {k} positive")
            object.__setattr__(self, "sigmas", tuple(float(s) for s in self.sigmas))

    @property
    def num_keypoints(self) -> int:
        """K."""
        return len(self.names)

    @classmethod
    def unnamed(cls, num_keypoints: int, flip_index: Sequence[int] | None = None) -> KeypointSchema:
        """A schema of `num_keypoints` points named "0", "1", ... (YOLO-pose folders name none)."""
        return cls(
            tuple(str(i) for i in range(num_keypoints)), flip_index=None if flip_index is None else tuple(flip_index)
        )

    def to_dict(self) -> dict:
        """Plain data (lists), for checkpoints and configs."""
        return {
            "names": list(self.names),
            "skeleton": [list(p) for p in self.skeleton],
            "flip_index": list(self.flip_index or ()),
            "sigmas": None if self.sigmas is None else list(self.sigmas),
        }

    @classmethod
    def from_dict(cls, data: dict) -> KeypointSchema:
        """The inverse of `to_dict`."""
        return cls(
            tuple(data["names"]),
            tuple(tuple(p) for p in data.get("skeleton", ())),
            tuple(data["flip_index"]) if data.get("flip_index") else None,
            tuple(data["sigmas"]) if data.get("sigmas") is not None else None,
        )


#: COCO's person: 17 keypoints, its skeleton (0-based), left <-> right flips and COCOeval's sigmas
COCO_PERSON = KeypointSchema(
    names=(
        "nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder", "right_shoulder", "left_elbow",
        "right_elbow", "left_wrist", "right_wrist", "left_hip", "right_hip", "left_knee", "right_knee", "left_ankle",
        "right_ankle",
    ),
    skeleton=(
        (15, 13), (13, 11), (16, 14), (14, 12), (11, 12), (5, 11), (6, 12), (5, 6), (5, 7), (6, 8), (7, 9), (8, 10),
        (1, 2), (0, 1), (0, 2), (1, 3), (2, 4), (3, 5), (4, 6),
    ),
    flip_index=(0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15),
    sigmas=COCO_PERSON_SIGMAS,
)  # fmt: skip
