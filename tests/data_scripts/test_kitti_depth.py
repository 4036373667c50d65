"""data_scripts/kitti_depth.py end to end from tiny fakes served on 127.0.0.1: BTS's two split files
and its archive list (in BTS's line formats), KITTI's data_depth_annotated.zip (train/ and val/) and
raw *_sync.zip archives (every camera, Velodyne); the result is read by vitdense's KITTIDepthDataModule."""

import dataclasses
import io
import json

import numpy as np
import pytest
from PIL import Image

from tests.data_scripts.fakes import help_text, load_script, make_zip, md5_of

SIZE = (20, 24)  # (H, W) of the fake frames
TRAIN_DRIVE, TEST_DRIVE, UNUSED_DRIVE = (f"2011_09_26_drive_{n:04d}_sync" for n in (1, 2, 5))
#: drive -> (frames with ground truth, frames without)
FRAMES = {TRAIN_DRIVE: ([5, 6], []), TEST_DRIVE: ([69], [75]), UNUSED_DRIVE: ([0], [])}


def png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def rgb(frame: int) -> np.ndarray:
    return np.random.default_rng(frame).integers(0, 256, (*SIZE, 3), dtype=np.uint8)


def depth(frame: int) -> np.ndarray:
    return np.full(SIZE, 256 * (frame % 50 + 2), np.uint16)  # 1/256 m: 2 to 51 m


def line(drive: str, frame: int, with_gt: bool) -> str:
    date, name = drive[:10], f"{frame:010d}.png"
    gt = f"{drive}/proj_depth/groundtruth/image_02/{name}" if with_gt else "None"
    return f"{date}/{drive}/image_02/data/{name} {gt} 721.5377"


@pytest.fixture
def served(server, monkeypatch):
    """The files on the test server, the script's MD5s and counts set to the fakes'; the script."""
    script = load_script("kitti_depth")
    root = server.root
    (root / "eigen_train_files_with_gt.txt").write_text(
        "\n".join(line(TRAIN_DRIVE, f, True) for f in FRAMES[TRAIN_DRIVE][0])  # (no final newline, as BTS's)
    )
    (root / "eigen_test_files_with_gt.txt").write_text(
        line(TEST_DRIVE, 69, True) + "\n" + line(TEST_DRIVE, 75, False) + "\n"
    )
    kitti = "https://s3.eu-central-1.amazonaws.com/avg-kitti/raw_data"
    urls = [f"{kitti}/2011_09_26_calib.zip"] + [f"{kitti}/{d[:-5]}/{d}.zip" for d in FRAMES]
    (root / "kitti_archives_to_download.txt").write_text("\n".join(urls) + "\n")
    annotated = {}
    for drive, (with_gt, without) in FRAMES.items():
        members = {}
        for frame in with_gt + without:
            for camera in ("image_02", "image_03"):
                members[f"2011_09_26/{drive}/{camera}/data/{frame:010d}.png"] = png(rgb(frame + (camera == "image_03")))
            members[f"2011_09_26/{drive}/velodyne_points/data/{frame:010d}.bin"] = b"\0" * 16
        members[f"2011_09_26/{drive}/image_02/timestamps.txt"] = b"2011-09-26 13:02:25.964389445\n"
        make_zip(root / f"{drive}.zip", members)
        folder = "val" if drive == TEST_DRIVE else "train"
        for frame in with_gt:
            for camera in ("image_02", "image_03"):
                name = f"{folder}/{drive}/proj_depth/groundtruth/{camera}/{frame:010d}.png"
                annotated[name] = png(depth(frame))
    make_zip(root / "data_depth_annotated.zip", annotated)
    for name in ("TRAIN_LIST", "TEST_LIST", "RAW_LIST"):
        archive = getattr(script, name)
        monkeypatch.setattr(script, name, dataclasses.replace(archive, md5=md5_of(root / archive.name)))
    monkeypatch.setattr(script, "COUNTS", {"train": 2, "test": 2})
    return script


def fetched(server) -> set[str]:
    return {path.lstrip("/") for path, _ in server.requests}


def test_end_to_end_rerun_verify_and_the_datamodule_reads_it(served, server, tmp_path, capsys):
    from vitdense.data import KITTIDepthDataModule, LoaderConfig

    script, out = served, tmp_path / "kitti"
    server.drop_after[f"/{TEST_DRIVE}.zip"] = 100  # the first GET breaks off: the download resumes
    assert script.main(["--out", str(out), "--base-url", server.url]) == 0
    assert (f"/{TEST_DRIVE}.zip", "bytes=100-") in server.requests
    assert f"{UNUSED_DRIVE}.zip" not in fetched(server) and "2011_09_26_calib.zip" not in fetched(server)
    said = capsys.readouterr().err
    assert "sha256" in said and "cvlibs.net" in said  # KITTI's unchecked downloads' sums printed; its terms
    files = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    expected = {".data_scripts.json", "eigen_train_files_with_gt.txt", "eigen_test_files_with_gt.txt"}
    expected |= {"kitti_archives_to_download.txt"}
    for drive in (TRAIN_DRIVE, TEST_DRIVE):
        with_gt, without = FRAMES[drive]
        expected |= {f"raw/2011_09_26/{drive}/image_02/data/{f:010d}.png" for f in with_gt + without}
        expected |= {f"raw/2011_09_26/{drive}/image_02/timestamps.txt"}
        expected |= {f"data_depth_annotated/{drive}/proj_depth/groundtruth/image_02/{f:010d}.png" for f in with_gt}
    assert files == expected  # image_02 only, train/ and val/ merged, archives deleted
    marker = json.loads((out / ".data_scripts.json").read_text())
    assert marker["archives"][f"{TEST_DRIVE}.zip"] == "" and marker["counts"] == {"train": 2, "test": 2}

    requests = len(server.requests)
    assert script.main(["--out", str(out), "--base-url", server.url]) == 0
    assert "already present and verified" in capsys.readouterr().out and len(server.requests) == requests

    data = KITTIDepthDataModule(root=str(out), crop_size=(16, 16), loader=LoaderConfig(batch_size=1, num_workers=0))
    data.setup("fit")
    assert len(data.train_dataset) == 2 and len(data.val_dataset) == 1  # the line without ground truth left out
    assert data.train_dataset[0].image.shape == (3, 16, 16)
    test = data.val_dataset[0]
    np.testing.assert_array_equal(test.depth.numpy().squeeze(), depth(69) / 256.0)

    assert script.main(["--verify", str(out)]) == 0
    gone = f"data_depth_annotated/{TEST_DRIVE}/proj_depth/groundtruth/image_02/{69:010d}.png"
    (out / gone).unlink()
    capsys.readouterr()
    assert script.main(["--verify", str(out)]) == 1
    said = capsys.readouterr().err
    assert f"1 of 1 listed files missing: {gone}" in said and "kitti_depth.py --out" in said


def test_test_only_downloads_only_the_test_drives(served, server, tmp_path, capsys):
    script, out = served, tmp_path / "kitti"
    assert script.main(["--out", str(out), "--base-url", server.url, "--test-only"]) == 0
    assert f"{TEST_DRIVE}.zip" in fetched(server) and f"{TRAIN_DRIVE}.zip" not in fetched(server)
    assert (
        "eigen_train_files_with_gt.txt" not in fetched(server)
        and not (out / "raw" / "2011_09_26" / TRAIN_DRIVE).exists()
    )
    assert script.main(["--verify", str(out), "--test-only"]) == 0
    capsys.readouterr()
    assert script.main(["--verify", str(out)]) == 1  # the training split too: its list is not there
    assert "eigen_train_files_with_gt.txt: missing split file" in capsys.readouterr().err


def test_an_archive_short_of_listed_frames_stops_the_run_and_finished_ones_are_not_fetched_again(
    served, server, tmp_path, capsys
):
    script, out = served, tmp_path / "kitti"
    good = (server.root / f"{TEST_DRIVE}.zip").read_bytes()
    make_zip(server.root / f"{TEST_DRIVE}.zip", {f"2011_09_26/{TEST_DRIVE}/image_02/data/{69:010d}.png": png(rgb(69))})
    assert script.main(["--out", str(out), "--base-url", server.url]) == 1
    frame = f"raw/2011_09_26/{TEST_DRIVE}/image_02/data/{75:010d}.png"
    assert f"1 of 2 listed files missing: {frame}" in capsys.readouterr().err
    assert not (out / f"{TRAIN_DRIVE}.zip").exists() and (out / f"{TEST_DRIVE}.zip").exists()  # kept to look at
    (server.root / f"{TEST_DRIVE}.zip").write_bytes(good)
    (out / f"{TEST_DRIVE}.zip").unlink()  # as the error says
    server.requests.clear()
    assert script.main(["--out", str(out), "--base-url", server.url]) == 0
    assert fetched(server) == {f"{TEST_DRIVE}.zip"}  # the annotated depth and the training drive were recorded


def test_help_says_where_each_file_comes_from_and_that_kitti_publishes_no_checksum():
    text = help_text("kitti_depth")
    for expected in ("data_depth_annotated.zip", "_sync.zip", "5e3406b", "--test-only", "cvlibs.net", "CC BY-NC-SA"):
        assert expected in text
    assert "md5 bb76b2f96dfaac75d6f860370924a261" in text and "md5 0d356fe7919588b7e10e8bf1e0638fd4" in text
    assert "no checksum published" in text


def test_the_datamodule_names_the_script_when_the_folder_is_missing(tmp_path):
    from vitdense.data import KITTIDepthDataModule

    with pytest.raises(FileNotFoundError, match=r"kitti: no such directory; run data_scripts/kitti_depth.py"):
        KITTIDepthDataModule(root=str(tmp_path / "kitti")).setup("fit")
