"""Depth data in BTS's layout (split files, RGB + 16-bit depth PNGs): bad files get clear
errors or counted skips; the synthetic rooms are written in NYU's layout and read by it."""

import logging

import numpy as np
import pytest
import torch
from PIL import Image

from vitdense.core.errors import DataError
from vitdense.data import LoaderConfig, NYUDepthDataModule, SyntheticDepthDataModule
from vitdense.data.base import SkipBadSamples
from vitdense.data.depth import read_depth_png, read_split_file
from vitdense.data.synthetic.depth import render_scene
from vitdense.types.depth import DepthImages

SIZE = (24, 32)


def write_sample(root, folder, i, depth_mm=None, size=SIZE, mode16=True):
    (root / folder / "scene").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(i)
    Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(root / folder / "scene" / f"rgb_{i:05d}.jpg")
    depth = depth_mm if depth_mm is not None else rng.integers(500, 9000, size).astype(np.uint16)
    picture = Image.fromarray(depth.astype(np.uint16) if mode16 else (depth // 40).astype(np.uint8))
    picture.save(root / folder / "scene" / f"sync_depth_{i:05d}.png")
    return f"/scene/rgb_{i:05d}.jpg /scene/sync_depth_{i:05d}.png 518.8579"


def nyu(root, train_lines, test_lines, **kwargs):
    (root / "nyudepthv2_train_files_with_gt.txt").write_text("\n".join(train_lines) + "\n")
    (root / "nyudepthv2_test_files_with_gt.txt").write_text("\n".join(test_lines) + "\n")
    loader = LoaderConfig(batch_size=2, num_workers=0, **kwargs)
    return NYUDepthDataModule(root=str(root), crop_size=(16, 16), loader=loader)


def test_nyu_layout_reads_millimetres_and_crops(tmp_path):
    depth = np.full(SIZE, 2500, dtype=np.uint16)
    depth[:4] = 0  # no measurement
    train = [write_sample(tmp_path, "sync", i, depth) for i in range(2)]
    test = [write_sample(tmp_path, "official_splits/test", 5, depth)]
    data = nyu(tmp_path, train, test)
    data.setup("fit")
    sample = data.val_dataset[0]
    assert isinstance(sample, DepthImages) and sample.depth.shape == SIZE and sample.image.shape == (3, *SIZE)
    assert set(torch.unique(sample.depth).tolist()) == {0.0, 2.5}  # mm / 1000, 0 kept
    batch = next(iter(data.train_dataloader()))
    assert batch.image.shape == (2, 3, 16, 16) and batch.depth.shape == (2, 16, 16)  # one size: no padding
    assert set(torch.unique(batch.depth).tolist()) <= {0.0, 2.5}  # nearest-neighbour depth: no blended values
    assert data.preprocess().resize == "none"  # evaluation at the size measured (BTS, DPT on NYU)


def test_bad_split_lines_are_named(tmp_path):
    path = tmp_path / "split.txt"
    path.write_text("a.jpg b.png 518.8\n\na.jpg b.png\n")
    with pytest.raises(DataError, match=r"split.txt:3: 2 fields"):
        read_split_file(path)
    path.write_text("a.jpg b.png focal\n")
    with pytest.raises(DataError, match=r"split.txt:1: focal length 'focal' is not a number"):
        read_split_file(path)
    entries_path = tmp_path / "kitti.txt"
    entries_path.write_text("x/a.png None 721.5\ny/b.png /d/b.png 721.5\n")
    entries = read_split_file(entries_path)
    assert [e.depth for e in entries] == [None, "d/b.png"]


def test_missing_files_and_lines_without_ground_truth(tmp_path, caplog):
    train = [write_sample(tmp_path, "sync", 0), "/scene/rgb_00001.jpg None 518.8", "/scene/gone.jpg /scene/gone.png 1"]
    data = nyu(tmp_path, train, [write_sample(tmp_path, "official_splits/test", 1)])
    with (
        caplog.at_level(logging.WARNING),
        pytest.raises(DataError, match=r"2 files listed are missing, first .*gone.jpg"),
    ):
        data.setup("fit")
    assert "1 of 3 samples have no ground truth" in caplog.text


def test_under_skip_missing_files_and_malformed_lines_are_left_out_and_counted(tmp_path, caplog):
    """`loader.on_bad_sample: skip`: what the split lists but is not there, and lines that are
    not '<image> <depth> <focal>', are left out at setup with one warning each that counts them
    and names the first; the rest is read as usual."""
    train = [
        write_sample(tmp_path, "sync", 0),
        "/scene/gone.jpg /scene/gone.png 518.8",  # image and depth missing: one sample, two files
        write_sample(tmp_path, "sync", 1),
        "/scene/rgb_00001.jpg /scene/lost.png 518.8",  # its depth missing
        "/scene/rgb_00000.jpg 518.8",  # two fields
        "/scene/rgb_00000.jpg /scene/sync_depth_00000.png f",  # focal not a number
    ]
    data = nyu(tmp_path, train, [write_sample(tmp_path, "official_splits/test", 2)], on_bad_sample="skip")
    with caplog.at_level(logging.WARNING):
        data.setup("fit")
    assert [e.image for e in data.train_dataset.entries] == ["scene/rgb_00000.jpg", "scene/rgb_00001.jpg"]
    assert data.train_dataset[1].depth.shape == (16, 16)  # read and cropped
    split = tmp_path / "nyudepthv2_train_files_with_gt.txt"
    assert f"{split}: 2 malformed lines left out (on_bad_sample=skip), first {split}:5: 2 fields" in caplog.text
    missing = f"{split}: 2 of 4 samples left out (on_bad_sample=skip): 3 listed files are missing, first "
    assert f"{missing}{tmp_path / 'sync' / 'scene' / 'gone.jpg'} ({split}:2)" in caplog.text
    assert len(data.val_dataset) == 1  # the test split: nothing to leave out, nothing said
    assert "nyudepthv2_test_files_with_gt.txt" not in caplog.text


def test_under_skip_a_split_with_nothing_left_still_stops(tmp_path):
    data = nyu(tmp_path, ["/scene/gone.jpg /scene/gone.png 1"], ["a b"], on_bad_sample="skip")
    with pytest.raises(DataError, match=r"test_files_with_gt.txt: no samples; expected lines"):
        data.setup("validate")  # every line malformed
    with pytest.raises(DataError, match=r"train_files_with_gt.txt: no sample is left: 1 of 1 .* missing"):
        data.setup("fit")


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("8-bit", r"8-bit.*16-bit greyscale"),
        ("size", r"is 20x32 \(HxW\) but its image .* is 24x32"),
        ("zero", r"every value is 0, no measurement"),
    ],
)
def test_bad_depth_files_are_clear_errors_or_counted_skips(tmp_path, case, message):
    root = tmp_path / case
    bad = {
        "8-bit": {"mode16": False},
        "size": {"depth_mm": np.full((20, 32), 1000, np.uint16)},
        "zero": {"depth_mm": np.zeros(SIZE, np.uint16)},
    }[case]
    test = [write_sample(root, "official_splits/test", 0, **bad), write_sample(root, "official_splits/test", 1)]
    data = nyu(root, [write_sample(root, "sync", 2)], test)
    data.setup("validate")
    with pytest.raises(DataError, match=message):
        data.val_dataset[0]
    skipping = SkipBadSamples(data.val_dataset)
    assert skipping[0] is None and skipping[1] is not None and skipping.take_count() == 1


def test_read_depth_png_scale(tmp_path):
    Image.fromarray(np.array([[0, 256, 512]], np.uint16)).save(tmp_path / "kitti.png")
    np.testing.assert_array_equal(read_depth_png(tmp_path / "kitti.png", 256.0), [[0, 1, 2]])  # KITTI: / 256


def test_synthetic_rooms_are_nyu_files_with_exact_geometry(tmp_path):
    image, depth, focal = render_scene(48, 64, np.random.default_rng(3))
    assert image.shape == (48, 64, 3) and image.dtype == np.uint8
    assert 0.5 <= depth.min() and depth.max() < 10  # NYU's range, every pixel measured
    # the floor recedes: in every column the bottom row is nearer than the top (the wall)
    assert (depth[-1] < depth[0]).all()
    data = SyntheticDepthDataModule(
        root=str(tmp_path / "rooms"), img_size=32, train_size=4, val_size=2, loader=LoaderConfig(2, num_workers=0)
    )
    data.setup("fit")
    assert (tmp_path / "rooms" / "sync" / "scene_000" / "sync_depth_00000.png").is_file()
    assert (tmp_path / "rooms" / "nyudepthv2_test_files_with_gt.txt").is_file()
    sample = data.val_dataset[0]
    assert sample.image.shape == (3, 32, 48) and sample.depth.shape == (32, 48)  # NYU's 3:4
    with Image.open(tmp_path / "rooms" / "official_splits" / "test" / "scene_000" / "sync_depth_00000.png") as png:
        assert png.mode.startswith("I")  # 16-bit
