"""Sliced inference (`vitdense.deploy.slicing`): the tile grid and the merge give SAHI's numbers, and
`vitdense.load`, `predict` and `serve` predict in tiles.

The reference numbers were computed with SAHI 0.12.8's own functions on the same inputs
(`sahi.slicing.get_slice_bboxes`; `GreedyNMMPostprocess`, `NMMPostprocess`, `NMSPostprocess`
of `sahi.postprocess.combine` on `ObjectPrediction`s, numpy backend).
"""

import json
import math

import numpy as np
import pytest
import torch
from torchvision.ops import box_iou, clip_boxes_to_image

import vitdense
from vitdense.core.errors import ConfigError
from vitdense.deploy.slicing import SlicedImages, Slicing, _merge_instances, merge_boxes, slice_boxes
from vitdense.types import InstanceMasks

# (height, width, slice_height, slice_width, overlap_height, overlap_width) -> SAHI's tiles
GRIDS = [
    (
        (200, 150, 64, 64, 0.2, 0.2),
        [
            [0, 0, 64, 64],
            [52, 0, 116, 64],
            [86, 0, 150, 64],
            [0, 52, 64, 116],
            [52, 52, 116, 116],
            [86, 52, 150, 116],
            [0, 104, 64, 168],
            [52, 104, 116, 168],
            [86, 104, 150, 168],
            [0, 136, 64, 200],
            [52, 136, 116, 200],
            [86, 136, 150, 200],
        ],
    ),  # fmt: skip
    ((100, 300, 128, 96, 0.25, 0.1), [[0, 0, 96, 100], [87, 0, 183, 100], [174, 0, 270, 100], [204, 0, 300, 100]]),
    ((64, 64, 64, 64, 0.2, 0.2), [[0, 0, 64, 64]]),
    ((50, 40, 64, 64, 0.2, 0.2), [[0, 0, 40, 50]]),  # an image smaller than a tile: one tile, the image
    (
        (130, 97, 40, 33, 0.5, 0.0),
        [
            [0, 0, 33, 40],
            [33, 0, 66, 40],
            [64, 0, 97, 40],
            [0, 20, 33, 60],
            [33, 20, 66, 60],
            [64, 20, 97, 60],
            [0, 40, 33, 80],
            [33, 40, 66, 80],
            [64, 40, 97, 80],
            [0, 60, 33, 100],
            [33, 60, 66, 100],
            [64, 60, 97, 100],
            [0, 80, 33, 120],
            [33, 80, 66, 120],
            [64, 80, 97, 120],
            [0, 90, 33, 130],
            [33, 90, 66, 130],
            [64, 90, 97, 130],
        ],
    ),  # fmt: skip
]


@pytest.mark.parametrize(("args", "tiles"), GRIDS)
def test_the_tile_grid_is_sahis(args, tiles):
    assert slice_boxes(*args).tolist() == tiles


def test_the_grid_of_a_large_image_is_sahis():
    tiles = slice_boxes(2048, 2048, 64, 64, 0.2, 0.2).tolist()
    assert len(tiles) == 1600
    assert tiles[:2] == [[0, 0, 64, 64], [52, 0, 116, 64]]
    assert tiles[38:41] == [[1976, 0, 2040, 64], [1984, 0, 2048, 64], [0, 52, 64, 116]]
    assert tiles[-2:] == [[1976, 1984, 2040, 2048], [1984, 1984, 2048, 2048]]


# clusters of near-duplicate boxes, as overlapping tiles give them, and loners
BOXES = [[167, 125, 177, 136], [172, 132, 192, 154], [171, 128, 199, 143], [72, 174, 96, 200], [72, 172, 83, 187],
    [72, 165, 84, 175], [49, 122, 78, 148], [57, 125, 83, 148], [46, 124, 70, 150], [50, 123, 74, 150],
    [68, 132, 92, 153], [70, 132, 97, 147], [65, 129, 82, 155], [42, 152, 65, 168], [46, 163, 71, 187],
    [48, 157, 77, 170], [48, 163, 63, 191], [149, 190, 161, 210]]  # fmt: skip
SCORES = [0.869, 0.811, 0.302, 0.904, 0.596, 0.753, 0.78, 0.572, 0.517, 0.954, 0.537, 0.736, 0.851, 0.405, 0.336,
    0.364, 0.44, 0.949]  # fmt: skip
LABELS = [0, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 1, 0, 1, 1, 1]
# (postprocess_type, match_metric, class_agnostic) -> SAHI's merged [x1, y1, x2, y2, score, category], by score
MERGED = {
    ("GREEDYNMM", "IOS", False): [[46, 122, 83, 150, 0.954, 1], [149, 190, 161, 210, 0.949, 1], [72, 172, 96, 200,
        0.904, 0], [167, 125, 177, 136, 0.869, 0], [65, 129, 82, 155, 0.851, 0], [171, 128, 199, 154, 0.811, 1],
        [72, 165, 84, 175, 0.753, 1], [70, 132, 97, 147, 0.736, 0], [68, 132, 92, 153, 0.537, 1], [48, 163, 63, 191,
        0.44, 1], [42, 152, 77, 170, 0.405, 1], [46, 163, 71, 187, 0.336, 0]],
    ("GREEDYNMM", "IOU", True): [[46, 122, 78, 150, 0.954, 1], [149, 190, 161, 210, 0.949, 1], [72, 174, 96, 200,
        0.904, 0], [167, 125, 177, 136, 0.869, 0], [65, 129, 82, 155, 0.851, 0], [172, 132, 192, 154, 0.811, 1],
        [72, 165, 84, 175, 0.753, 1], [68, 132, 97, 153, 0.736, 0], [72, 172, 83, 187, 0.596, 0], [57, 125, 83, 148,
        0.572, 1], [46, 163, 71, 191, 0.44, 1], [42, 152, 65, 168, 0.405, 1], [48, 157, 77, 170, 0.364, 1],
        [171, 128, 199, 143, 0.302, 1]],
    ("NMM", "IOU", False): [[46, 122, 78, 150, 0.954, 1], [149, 190, 161, 210, 0.949, 1], [72, 174, 96, 200, 0.904,
        0], [167, 125, 177, 136, 0.869, 0], [65, 129, 82, 155, 0.851, 0], [172, 132, 192, 154, 0.811, 1], [72, 165,
        84, 175, 0.753, 1], [70, 132, 97, 147, 0.736, 0], [72, 172, 83, 187, 0.596, 0], [68, 132, 92, 153, 0.537, 1],
        [48, 163, 63, 191, 0.44, 1], [42, 152, 65, 168, 0.405, 1], [48, 157, 77, 170, 0.364, 1], [46, 163, 71, 187,
        0.336, 0], [171, 128, 199, 143, 0.302, 1]],
    ("NMS", "IOS", True): [[50, 123, 74, 150, 0.954, 1], [149, 190, 161, 210, 0.949, 1], [72, 174, 96, 200, 0.904,
        0], [167, 125, 177, 136, 0.869, 0], [65, 129, 82, 155, 0.851, 0], [172, 132, 192, 154, 0.811, 1], [72, 165,
        84, 175, 0.753, 1], [70, 132, 97, 147, 0.736, 0], [48, 163, 63, 191, 0.44, 1], [42, 152, 65, 168, 0.405, 1]],
    ("NMS", "IOU", False): [[50, 123, 74, 150, 0.954, 1], [149, 190, 161, 210, 0.949, 1], [72, 174, 96, 200, 0.904,
        0], [167, 125, 177, 136, 0.869, 0], [65, 129, 82, 155, 0.851, 0], [172, 132, 192, 154, 0.811, 1], [72, 165,
        84, 175, 0.753, 1], [70, 132, 97, 147, 0.736, 0], [72, 172, 83, 187, 0.596, 0], [57, 125, 83, 148, 0.572, 1],
        [68, 132, 92, 153, 0.537, 1], [48, 163, 63, 191, 0.44, 1], [42, 152, 65, 168, 0.405, 1], [48, 157, 77, 170,
        0.364, 1], [46, 163, 71, 187, 0.336, 0], [171, 128, 199, 143, 0.302, 1]],
}  # fmt: skip


@pytest.mark.parametrize(("kind", "metric", "agnostic"), list(MERGED))
def test_the_merge_is_sahis(kind, metric, agnostic):
    slicing = Slicing(postprocess_type=kind, postprocess_match_metric=metric, postprocess_class_agnostic=agnostic)
    found = merge_boxes(torch.tensor(BOXES, dtype=torch.float32), torch.tensor(SCORES), torch.tensor(LABELS), slicing)
    rows = [
        [*b, round(s, 3), lab]
        for b, s, lab in zip(found.boxes.tolist(), found.scores.tolist(), found.labels.tolist(), strict=True)
    ]
    assert rows == MERGED[(kind, metric, agnostic)]


def test_instance_masks_cut_by_tiles_merge_into_the_whole():
    """An object across two tiles: each tile's part, pasted into the image's frame and
    merged by OR, is the object; another class's instance in the overlap stays apart."""
    truth = torch.zeros(40, 60, dtype=torch.bool)
    truth[10:30, 20:45] = True  # spans tile A (x 0..36) and tile B (x 24..60)
    other = torch.zeros(40, 60, dtype=torch.bool)
    other[12:20, 26:34] = True
    a, b = truth[:, 0:36], truth[:, 24:60]
    parts = [
        (
            InstanceMasks(torch.stack([a, other[:, 0:36]]), torch.tensor([0, 1]), torch.tensor([0.9, 0.8])),
            [0, 0, 36, 40],
        ),
        (InstanceMasks(b[None], torch.tensor([0]), torch.tensor([0.7])), [24, 0, 36, 40]),
    ]
    merged = _merge_instances(parts, (40, 60), Slicing(confidence_threshold=0.5))
    assert merged.labels.tolist() == [0, 1] and merged.scores.tolist() == pytest.approx([0.9, 0.8])
    assert torch.equal(merged.masks[0], truth) and torch.equal(merged.masks[1], other)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"overlap_height_ratio": 1.0}, "0 <= ratio < 1"),
        ({"overlap_width_ratio": -0.1}, "0 <= ratio < 1"),
        ({"slice_height": 0}, "slicing.slice_height=0"),
        ({"postprocess_type": "WBF"}, "GREEDYNMM, NMM, NMS"),
        ({"postprocess_match_metric": "GIOU"}, "IOS or IOU"),
    ],
)
def test_bad_options_are_named(options, message):
    with pytest.raises(ConfigError, match=message):
        Slicing(**options)


@pytest.fixture(scope="module")
def det(trained):
    """The detection demo's one-step checkpoint (trained at 32 pixels), an image of 48 x 64,
    and the checkpoint's sliced predictor."""
    image = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    return trained["det"][1], image, vitdense.load(trained["det"][1], slicing=SLICING)


#: tiles of the demo's training size; every prediction kept, so that the merge has work to do
SLICING = Slicing(slice_height=32, overlap_height_ratio=0.25, confidence_threshold=0.0, batch_size=3)


def test_a_sliced_prediction_is_its_tiles_merged_in_the_images_frame(det, monkeypatch):
    """Sliced = each tile (and the whole image) predicted alone as an image of its own,
    clipped to the tile, shifted by its place in the image and merged; the tiles run in
    batches of batch_size."""
    _, image, predictor = det
    calls = []
    step = predictor.task.predict_step
    monkeypatch.setattr(
        predictor.task, "predict_step", lambda batch, i: calls.append(len(batch.index)) or step(batch, i)
    )
    sliced = predictor(image)
    tiles = slice_boxes(48, 64, 32, 32, 0.25, 0.25).tolist()  # 6 tiles + the whole image
    assert calls == [1, 3, 3, 1]  # the image, then its 7 crops 3 at a time
    predictor.slicing = None
    try:
        alone = predictor([image[y1:y2, x1:x2] for x1, y1, x2, y2 in tiles] + [image])
    finally:
        predictor.slicing = SLICING
    shifts = [[x1, y1, x1, y1] for x1, y1, *_ in tiles] + [[0, 0, 0, 0]]
    # (each tile's boxes clipped to the tile, as SAHI's model wrappers clip them)
    boxes = [clip_boxes_to_image(torch.from_numpy(r.boxes), r.size) for r in alone]
    boxes = torch.cat([b + torch.tensor(s) for b, s in zip(boxes, shifts, strict=True)])
    scores = torch.cat([torch.from_numpy(r.scores) for r in alone])
    labels = torch.cat([torch.from_numpy(r.labels) for r in alone])
    expected = merge_boxes(boxes, scores, labels, SLICING)
    assert sliced.size == (48, 64) and len(sliced) == len(expected.scores) < len(scores)
    np.testing.assert_allclose(sliced.boxes, expected.boxes.numpy(), atol=1e-3)
    np.testing.assert_allclose(sliced.scores, expected.scores.numpy(), atol=1e-5)
    assert sliced.boxes[:, 2].max() > 32 and sliced.boxes[:, 3].max() > 32  # beyond the first tile: the image's frame
    assert (sliced.boxes[:, 2] <= 64 + 1e-3).all() and (sliced.boxes[:, 3] <= 48 + 1e-3).all()


def test_predict_and_serve_slice_as_the_predictor_does(det, tmp_path, monkeypatch):
    """`predict --slicing.*` writes the sliced predictor's boxes; `serve --slice_height ...`
    gives each worker's predictor that slicing."""
    import litserve
    from PIL import Image

    from vitdense import serve
    from vitdense.cli import main
    from vitdense.deploy.predictor import Predictor

    ckpt, image, predictor = det
    expected = predictor(image)
    photos = tmp_path / "photos"
    photos.mkdir()
    Image.fromarray(image).save(photos / "large.png")
    options = ["--slicing.slice_height=32", "--slicing.overlap_height_ratio=0.25", "--slicing.confidence_threshold=0"]
    main(["predict", f"--ckpt_path={ckpt}", f"--data.predict_dir={photos}", "--trainer.logger=false", *options,
          f"--trainer.default_root_dir={tmp_path}", "--trainer.enable_progress_bar=false"])  # fmt: skip
    rows = json.loads((tmp_path / "predictions" / "detections.json").read_text())
    assert len(rows) == len(expected)
    written = sorted((r["score"], r["bbox"]) for r in rows)
    for (score, bbox), (s, b) in zip(
        written, sorted(zip(expected.scores.tolist(), expected.boxes.tolist(), strict=True)), strict=True
    ):
        assert score == pytest.approx(s, abs=1e-5) and bbox == pytest.approx(
            [b[0], b[1], b[2] - b[0], b[3] - b[1]], abs=1e-3
        )

    ran, loaded = {}, {}
    monkeypatch.setattr(litserve.LitServer, "run", lambda self, **kwargs: ran.update(server=self))
    monkeypatch.setattr(Predictor, "from_checkpoint", lambda path, **kwargs: loaded.update(kwargs))
    monkeypatch.delenv("LIT_SERVER_API_KEY", raising=False)
    options = ["--slice_height=32", "--overlap_height_ratio=0.25", "--confidence_threshold=0", "--slice_batch_size=3"]
    serve.main([f"--ckpt_path={ckpt}", *options])
    ran["server"].lit_api.setup("cpu")  # (what each worker does)
    assert loaded["slicing"] == SLICING


def test_a_task_without_objects_is_refused(trained):
    from vitdense import serve

    with pytest.raises(ConfigError, match="sliced inference merges the boxes of detection"):
        vitdense.load(trained["seg"][1], slicing=Slicing(slice_height=32))
    with pytest.raises(ConfigError, match="ClassificationTask predicts ClassificationResult, not objects"):
        serve.main([f"--ckpt_path={trained['cls'][1]}", "--slice_height=32"])


def test_sliced_images_batch_themselves(det):
    """`pad_collate` of sliced images (what predict's loader makes) keeps each image whole."""
    from vitdense.deploy.slicing import SlicedImage
    from vitdense.types.collate import pad_collate

    _, image, _ = det
    batch = pad_collate([SlicedImage(image, 3, None, SLICING), SlicedImage(image[:20], 4, None, SLICING)])
    assert isinstance(batch, SlicedImages) and batch.index.tolist() == [3, 4]
    assert batch.orig_sizes == [(48, 64), (20, 64)] and math.prod(batch.images[1].pixels.shape) == 20 * 64 * 3


def test_the_bench_scenes_hold_what_they_say_and_score_their_own_truth_perfectly():
    """12-24 px objects apart from each other; their own boxes as detections score AP 1
    through pycocotools (the scoring path of `python -m vitdense.bench sliced`)."""
    from vitdense.bench.sliced import coco_scores, small_object_scene

    scene = small_object_scene(256, 12, 3, np.random.default_rng(0))
    sides = np.maximum(scene.boxes[:, 2] - scene.boxes[:, 0], scene.boxes[:, 3] - scene.boxes[:, 1])
    assert len(scene.boxes) == 12 and sides.min() >= 12 and sides.max() <= 24
    iou = box_iou(torch.from_numpy(scene.boxes), torch.from_numpy(scene.boxes)).fill_diagonal_(0)
    assert iou.max() == 0 and set(scene.labels.tolist()) <= {0, 1, 2}
    truth = (scene.boxes, np.ones(12, dtype=np.float32), scene.labels)
    assert coco_scores([scene], [truth]) == {"AP": 1.0, "AP50": 1.0, "AR_small": 1.0}


def test_instance_segmentation_slices_and_panoptic_is_refused():
    """An EoMT task asked for instances predicts in tiles (masks at the image's size, best
    first); asked for panoptic segments, it is refused."""
    from functools import partial

    from vitdense.core.preprocess import InferenceData, Preprocess
    from vitdense.deploy.predictor import Predictor
    from vitdense.heads.eomt import EoMTHead
    from vitdense.results.universal import InstanceResult
    from vitdense.tasks import BackboneConfig
    from vitdense.tasks.universal import UniversalSegmentationTask

    backbone = BackboneConfig(name="vit_tiny_patch16_224", img_size=32, model_args={"depth": 1})
    head = partial(EoMTHead, num_queries=4, num_blocks=1)
    task = UniversalSegmentationTask(3, is_thing=[True, True, False], head=head, backbone=backbone)
    data = InferenceData(Preprocess("short_side", 32, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), max_size=32))
    with pytest.raises(ConfigError, match="UniversalSegmentationTask predicts PanopticResult, not objects"):
        Predictor(task, data, slicing=Slicing(slice_height=32))
    task.segmentation = "instance"
    image = np.random.default_rng(0).integers(0, 256, (40, 56, 3), dtype=np.uint8)
    found = Predictor(task, data, slicing=Slicing(slice_height=32, confidence_threshold=0.0))(image)
    assert isinstance(found, InstanceResult) and found.masks.shape[1:] == (40, 56) and len(found) > 0
    assert (found.scores[:-1] >= found.scores[1:]).all()
