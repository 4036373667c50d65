"""data_scripts/coco.py end to end from tiny COCO-like zips served on 127.0.0.1."""

import dataclasses
import json

import pytest

from tests.data_scripts.fakes import help_text, jpeg_bytes, load_script, make_zip, md5_of

COUNTS = {"train2017": 3, "val2017": 2}


@pytest.fixture
def coco(server, monkeypatch):
    """The script, with its archives' MD5s and counts replaced by those of tiny zips the server serves."""
    script = load_script("coco")
    contents = {
        "train": {f"train2017/{i:012d}.jpg": jpeg_bytes(i) for i in range(3)} | {"train2017/": b""},
        "val": {f"val2017/{i:012d}.jpg": jpeg_bytes(10 + i) for i in range(2)},
        "annotations": {
            f"annotations/{kind}_{split}2017.json": json.dumps({"images": [], "annotations": []}).encode()
            for kind in ("instances", "captions")
            for split in ("train", "val")
        },
    }
    for key, members in contents.items():
        archive = script.ARCHIVES[key]
        made = make_zip(server.root / archive.path, members)
        monkeypatch.setitem(script.ARCHIVES, key, dataclasses.replace(archive, md5=md5_of(made)))
    for folder, count in COUNTS.items():
        monkeypatch.setitem(script.COUNTS, folder, count)
    return script


def paths(requests):
    return [path for path, _ in requests]


def test_end_to_end_and_reruns(coco, server, tmp_path, capsys):
    out = tmp_path / "coco"
    assert coco.main(["--out", str(out), "--base-url", server.url, "--splits", "val"]) == 0
    assert paths(server.requests) == ["/zips/val2017.zip", "/annotations/annotations_trainval2017.zip"]
    assert len(list((out / "val2017").glob("*.jpg"))) == 2 and not (out / "train2017").exists()
    assert (out / "annotations" / "instances_val2017.json").is_file()
    assert not list(out.glob("*.zip"))  # archives deleted after the check
    # both splits: only the train images are fetched
    assert coco.main(["--out", str(out), "--base-url", server.url, "--keep-archives"]) == 0
    assert paths(server.requests)[2:] == ["/zips/train2017.zip"]
    assert len(list((out / "train2017").glob("*.jpg"))) == 3 and (out / "train2017.zip").is_file()
    marker = json.loads((out / ".data_scripts.json").read_text())
    assert marker["dataset"] == "coco2017" and marker["counts"] == COUNTS
    assert marker["archives"] == {a.name: a.md5 for a in coco.ARCHIVES.values()}
    # complete: nothing asked of the server
    capsys.readouterr()
    assert coco.main(["--out", str(out), "--base-url", server.url]) == 0
    assert f"already present and verified: {out}" in capsys.readouterr().out and len(server.requests) == 3
    # a file gone: the marker is not trusted, the kept archive is used, again no request
    (out / "train2017" / "000000000001.jpg").unlink()
    assert coco.main(["--out", str(out), "--base-url", server.url]) == 0
    assert len(server.requests) == 3 and (out / "train2017" / "000000000001.jpg").is_file()


def test_verify_names_what_is_missing(coco, server, tmp_path, capsys):
    out = tmp_path / "coco"
    assert coco.main(["--out", str(out), "--base-url", server.url]) == 0
    assert coco.main(["--verify", str(out)]) == 0
    (out / "val2017" / "000000000000.jpg").unlink()
    (out / "annotations" / "instances_train2017.json").unlink()
    assert coco.main(["--verify", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{out / 'val2017'}: 1 files matching *.jpg, expected 2" in err
    assert f"{out / 'annotations' / 'instances_train2017.json'}: missing file" in err
    assert f"{out}: 2 problems" in err


def test_wrong_checksum_fails_with_the_file_named(coco, server, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(coco.ARCHIVES, "val", dataclasses.replace(coco.ARCHIVES["val"], md5="f" * 32))
    out = tmp_path / "coco"
    assert coco.main(["--out", str(out), "--base-url", server.url, "--splits", "val"]) == 1
    err = capsys.readouterr().err
    assert "error: " in err and "val2017.zip" in err and "expected " + "f" * 32 in err
    assert (out / "val2017.zip.bad").is_file() and not (out / "val2017").exists()


def test_help_lists_sizes_and_licences():
    text = help_text("coco")
    for expected in ("train2017.zip", "~18.0 GiB", "~777.8 MiB", "CC BY 4.0", "Flickr", "cocodataset.org/#termsofuse"):
        assert expected in text
    assert "--base-url" in text and "--keep-archives" in text and "--out" in text
