"""data_scripts/nyu_depth.py end to end from tiny fakes of its five files served on 127.0.0.1: BTS's
split files and splits.mat, NYU's labeled .mat (HDF5, MATLAB's axis order) and BTS's sync.zip;
the result is read by vitdense's NYUDepthDataModule."""

import dataclasses
import io
import json
import sys

import numpy as np
import pytest
from PIL import Image

from tests.data_scripts.fakes import help_text, jpeg_bytes, load_script, make_zip, md5_of

TEST_FRAMES = {1: "bathroom", 3: "kitchen"}  # 0-based frame -> scene type; frames 0 and 2 are training frames
SIZE = (20, 24)  # (H, W) of the fake frames


def png16(depth_mm: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(depth_mm.astype(np.uint16)).save(buffer, format="PNG")
    return buffer.getvalue()


def write_labeled_mat(path, rng) -> tuple[np.ndarray, np.ndarray]:
    """NYU's labeled set as h5py sees the v7.3 .mat: images [N, 3, W, H] uint8, rawDepths [N, W, H]
    float32 metres, sceneTypes [1, N] references to uint16 character arrays. Returns (images [N, H, W, 3],
    depths [N, H, W]) in the usual order. (Without h5py, a file of junk: the script stops before reading it.)"""
    n, (h, w) = 4, SIZE
    ramp = np.linspace(0, 120, w)[None, :, None]  # smooth, so that JPEG keeps it to a level or two
    images = (rng.integers(0, 120, (n, 1, 1, 3)) + ramp + np.zeros((n, h, w, 3))).astype(np.uint8)
    depths = rng.uniform(0.5, 9.5, (n, h, w)).astype(np.float32)
    try:
        import h5py
    except ImportError:
        path.write_bytes(b"not HDF5")
        return images, depths
    with h5py.File(path, "w") as mat:
        mat["images"] = images.transpose(0, 3, 2, 1)
        mat["rawDepths"] = depths.transpose(0, 2, 1)
        refs = []
        for i in range(n):
            name = TEST_FRAMES.get(i, "office")
            mat[f"#refs#/{i}"] = np.array([[ord(c)] for c in name], np.uint16)
            refs.append(mat[f"#refs#/{i}"].ref)
        mat.create_dataset("sceneTypes", data=np.array([refs], dtype=h5py.ref_dtype))
    return images, depths


@pytest.fixture
def served(server, tmp_path, monkeypatch):
    """The five files on the test server, the script's MD5s and counts set to the fakes'; (script, images, depths)."""
    import scipy.io

    script = load_script("nyu_depth")
    rng = np.random.default_rng(0)
    images, depths = write_labeled_mat(server.root / "nyu_depth_v2_labeled.mat", rng)
    scipy.io.savemat(server.root / "splits.mat", {"testNdxs": np.array([[2], [4]]), "trainNdxs": np.array([[1], [3]])})
    test_lines = [
        f"{scene}/rgb_{i:05d}.jpg {scene}/sync_depth_{i:05d}.png 518.8579" for i, scene in TEST_FRAMES.items()
    ]
    (server.root / "nyudepthv2_test_files_with_gt.txt").write_text(
        "\n".join(test_lines)
    )  # (BTS's has no final newline)
    members, train_lines = {}, []
    for i in range(3):
        members[f"sync/living_room_0001/rgb_{i:05d}.jpg"] = jpeg_bytes(i, SIZE[::-1])
        members[f"sync/living_room_0001/sync_depth_{i:05d}.png"] = png16(np.full(SIZE, 1500 + i))
        train_lines.append(f"/living_room_0001/rgb_{i:05d}.jpg /living_room_0001/sync_depth_{i:05d}.png 518.8579")
    (server.root / "nyudepthv2_train_files_with_gt.txt").write_text("\n".join(train_lines) + "\n")
    make_zip(server.root / "sync.zip", members)
    for name in ("TRAIN_LIST", "TEST_LIST", "SPLITS"):
        archive = getattr(script, name)
        monkeypatch.setattr(script, name, dataclasses.replace(archive, md5=md5_of(server.root / archive.name)))
    monkeypatch.setattr(script, "COUNTS", {"train": 3, "test": 2})
    return script, images, depths


def test_end_to_end_rerun_and_the_datamodule_reads_it(served, server, tmp_path, capsys):
    from vitdense.data import LoaderConfig, NYUDepthDataModule

    script, images, depths = served
    out = tmp_path / "nyu"
    server.drop_after["/sync.zip"] = 100  # the first GET breaks off: the download resumes
    assert script.main(["--out", str(out), "--base-url", server.url]) == 0
    assert ("/sync.zip", "bytes=100-") in server.requests
    said = capsys.readouterr().err
    assert "present (no checksum is published)" not in said and "sha256" in said  # printed for the user's records
    for i, scene in TEST_FRAMES.items():  # as BTS writes them: raw depth x 1000 truncated, the RGB border black
        folder = out / "official_splits" / "test" / scene
        with Image.open(folder / f"sync_depth_{i:05d}.png") as png:
            np.testing.assert_array_equal(np.asarray(png), (depths[i] * 1000).astype(np.uint16))
        with Image.open(folder / f"rgb_{i:05d}.jpg") as jpg:
            rgb = np.asarray(jpg).astype(int)
        assert rgb.shape == (*SIZE, 3) and np.abs(rgb[9:, 9:] - images[i][9:, 9:]).mean() < 4  # (JPEG)
        assert rgb[:7].max() < 40 and rgb[:, :7].max() < 40  # the border blacked out (JPEG rings a little)
    assert not (out / "official_splits" / "test" / "office").exists()  # training frames of the .mat not written
    assert not (out / "sync.zip").exists() and not (out / "nyu_depth_v2_labeled.mat").exists()  # deleted
    assert (out / "nyudepthv2_train_files_with_gt.txt").is_file()  # kept: the DataModule reads it
    marker = json.loads((out / ".data_scripts.json").read_text())
    assert marker["archives"]["sync.zip"] == "" and marker["counts"] == {"train": 3, "test": 2}
    requests = len(server.requests)
    assert script.main(["--out", str(out), "--base-url", server.url]) == 0
    assert "already present and verified" in capsys.readouterr().out and len(server.requests) == requests
    assert script.main(["--verify", str(out)]) == 0
    data = NYUDepthDataModule(root=str(out), crop_size=(16, 16), loader=LoaderConfig(batch_size=2, num_workers=0))
    data.setup("fit")
    assert len(data.train_dataset) == 3 and len(data.val_dataset) == 2
    assert data.val_dataset[0].depth.shape == SIZE


def test_verify_names_what_is_missing(served, server, tmp_path, capsys):
    script, _, _ = served
    out = tmp_path / "nyu"
    assert script.main(["--out", str(out), "--base-url", server.url, "--test-only"]) == 0
    assert not (out / "sync").exists() and script.main(["--verify", str(out), "--test-only"]) == 0
    (out / "official_splits" / "test" / "kitchen" / "rgb_00003.jpg").unlink()
    capsys.readouterr()
    assert script.main(["--verify", str(out), "--test-only"]) == 1
    assert "1 of 4 listed files missing, first kitchen/rgb_00003.jpg" in capsys.readouterr().err
    assert script.main(["--verify", str(out)]) == 1  # the training split too: its list is not there
    assert "nyudepthv2_train_files_with_gt.txt: missing split file" in capsys.readouterr().err


def test_without_h5py_the_error_says_what_to_install(served, server, tmp_path, monkeypatch, capsys):
    script, _, _ = served
    monkeypatch.setitem(sys.modules, "h5py", None)  # import h5py -> ImportError
    assert script.main(["--out", str(tmp_path / "nyu"), "--base-url", server.url, "--test-only"]) == 1
    assert "pip install h5py scipy" in capsys.readouterr().err


def test_help_says_where_each_file_comes_from_and_that_no_checksum_is_published():
    text = help_text("nyu_depth")
    for expected in ("sync.zip", "1AysroWpfISmm-yRFGBgFTrLy6FjQwvwP", "nyu_depth_v2_labeled.mat", "5e3406b"):
        assert expected in text
    assert text.count("no checksum published") == 2 and "md5 08e3c3aea27130ac7c01ffd739a4535f" in text
