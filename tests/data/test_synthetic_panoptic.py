"""The generated panoptic demo set: deterministic scenes of stuff and things, written in COCO
panoptic's format and read back through CocoPanopticDataModule's own path."""

import inspect
import io
import json

import numpy as np
import pytest
import torch

from vitdense.data import LoaderConfig, PanopticImages, SyntheticPanopticDataModule, write_synthetic_panoptic
from vitdense.data.synthetic.universal import CATEGORIES, MIN_PIXELS, panoptic_scene


def scenes(count: int, size: int = 48, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [panoptic_scene(int(rng.integers(36, 60)), size, np.random.default_rng([seed, i])) for i in range(count)]


def test_scenes_hold_stuff_things_crowds_and_void():
    made = scenes(60)
    labels = [[label for label, _ in segments] for _, _, segments in made]
    assert set().union(*map(set, labels)) == set(range(len(CATEGORIES)))  # every class appears
    assert any(not any(CATEGORIES[k][2] for k in ks) for ks in labels)  # scenes without things
    assert any(crowd for _, _, segments in made for _, crowd in segments)  # and with a crowd
    assert any((numbers == 0).any() for _, numbers, _ in made)  # void
    touching = 0
    for image, numbers, segments in made:
        assert image.dtype == np.uint8 and image.shape[:2] == numbers.shape
        sizes = np.bincount(numbers.ravel(), minlength=len(segments) + 1)[1:]
        assert len(sizes) == len(segments) and (sizes >= MIN_PIXELS).all()  # every segment has pixels
        things = np.isin(numbers, [k + 1 for k, (label, _) in enumerate(segments) if CATEGORIES[label][2]])
        # two things side by side: neighbouring pixels of two different thing segments
        touching += bool((things[:, 1:] & things[:, :-1] & (numbers[:, 1:] != numbers[:, :-1])).any())
    assert touching >= 3


def test_things_wear_their_own_colours():
    """Each thing's median hue is nearest its own class's (shape and colour both tell the
    class; shading and textures change the brightness, so colours are compared scaled to
    their brightest channel)."""
    colours = np.array([c for _, _, thing, c in CATEGORIES if thing], dtype=np.float32)
    colours /= colours.max(1, keepdims=True)
    checked = 0
    for image, numbers, segments in scenes(30):
        for k, (label, crowd) in enumerate(segments):
            if CATEGORIES[label][2] and not crowd:
                median = np.median(image[numbers == k + 1].astype(np.float32), 0)
                assert np.abs(colours - median / median.max()).max(1).argmin() == label
                checked += 1
    assert checked >= 40


@pytest.fixture(scope="module")
def datamodule(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic_panoptic")
    dm = SyntheticPanopticDataModule(
        root=str(root), img_size=32, train_size=8, val_size=6, loader=LoaderConfig(batch_size=4, num_workers=0)
    )
    dm.setup("fit")
    return dm


def test_written_once_in_cocos_format_and_read_back(datamodule):
    dm = datamodule
    assert dm.class_names == ["disc", "square", "triangle", "sky", "grass", "water"]
    assert dm.category_ids == [2, 5, 9, 101, 130, 170] and dm.is_thing == [True] * 3 + [False] * 3
    assert dm.palette == tuple(c for *_, c in CATEGORIES) and dm.eval_size == 32
    data = json.loads((dm.root / "annotations" / "panoptic_val.json").read_text())
    assert len(data["images"]) == 6 and {c["id"] for c in data["categories"]} == {2, 5, 9, 101, 130, 170}
    # the PNGs hold the scenes the generator drew, segment for segment
    for i, entry in enumerate(data["images"]):
        rng = np.random.default_rng([0, sum(map(ord, "val")), i])
        height, width = (int(v) for v in rng.integers(24, 41, 2))
        _, numbers, segments = panoptic_scene(height, width, rng)
        full = dm.val_dataset[i].eval_targets
        assert (entry["height"], entry["width"]) == (height, width) == tuple(full.masks.shape[1:])
        expected = numbers[None] == np.arange(1, len(segments) + 1)[:, None, None]
        assert torch.equal(full.masks, torch.from_numpy(expected))
        assert full.labels.tolist() == [label for label, _ in segments]
        assert full.iscrowd.tolist() == [crowd for _, crowd in segments]
        assert full.area.tolist() == expected.sum((1, 2)).tolist()
    # a second DataModule with the same settings reuses the files; other settings rewrite them
    png = dm.root / "annotations" / "panoptic_val" / "000000.png"
    before = png.stat().st_mtime_ns, png.read_bytes()
    same = SyntheticPanopticDataModule(root=str(dm.root), img_size=32, train_size=8, val_size=6)
    same.setup("validate")
    assert png.stat().st_mtime_ns == before[0]
    other = SyntheticPanopticDataModule(root=str(dm.root), img_size=32, train_size=8, val_size=6, seed=1)
    other.setup("validate")
    assert png.read_bytes() != before[1] and json.loads((dm.root / "meta.json").read_text())["seed"] == 1
    dm.write_if_missing()  # (back to the fixture's settings for the tests that follow)


def test_batches(datamodule):
    dm = datamodule
    train = next(iter(dm.train_dataloader()))
    assert isinstance(train, PanopticImages) and train.image.shape == (4, 3, 32, 32)
    assert all(t.masks.shape == (len(t.labels), 32, 32) and not t.iscrowd.any() for t in train.targets)
    assert train.eval_targets == (None,) * 4 and any(len(t.labels) for t in train.targets)
    val = next(iter(dm.val_dataloader()))
    assert all(max(size) == 32 for size in val.image_sizes.sizes)  # the long side, as EoMT evaluates
    assert [tuple(t.masks.shape[1:]) for t in val.eval_targets] == list(val.orig_sizes)
    pixels = np.random.default_rng(0).integers(0, 256, (45, 70, 3), dtype=np.uint8)
    assert torch.equal(dm.preprocess()(pixels), dm.eval_transforms()(image=pixels)["image"])


def test_hyperparameters_rebuild_it(datamodule):
    dm = datamodule
    taken = set(inspect.signature(type(dm)).parameters) - {"backbone"}
    assert set(dm.hparams) == taken  # the paths and categories it passes its base are not recorded
    buffer = io.BytesIO()
    torch.save({"hparams": dict(dm.hparams)}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)["hparams"]
    rebuilt = type(dm)(**{**saved, "loader": LoaderConfig(**saved["loader"])})
    assert rebuilt.class_names == dm.class_names and rebuilt.root == dm.root and rebuilt.mean == dm.mean


def test_generation_is_deterministic(tmp_path):
    a = write_synthetic_panoptic(tmp_path / "a", "val", 3, img_size=32, seed=5)
    b = write_synthetic_panoptic(tmp_path / "b", "val", 3, img_size=32, seed=5)
    assert a.read_text() == b.read_text()
    for name in ("000000.png", "000002.png"):
        assert (a.parent / "panoptic_val" / name).read_bytes() == (b.parent / "panoptic_val" / name).read_bytes()
