"""data_scripts/coco_panoptic.py end to end from a tiny panoptic_annotations_trainval2017.zip
(zips of PNGs inside a zip, as COCO's) served on 127.0.0.1, then read by CocoPanopticDataModule."""

import dataclasses
import io
import json
import shutil
import zipfile

import pytest

from tests.data_scripts.fakes import help_text, load_script, make_zip, md5_of
from vitdense.data import CocoPanopticDataModule, LoaderConfig, write_synthetic_panoptic

COUNTS = {"panoptic_train2017": 3, "panoptic_val2017": 2}


def zipped(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def coco_files(tmp_path_factory):
    """A tiny COCO panoptic dataset in COCO's layout (the synthetic scenes)."""
    root = tmp_path_factory.mktemp("made")
    for split, count in COUNTS.items():
        write_synthetic_panoptic(root, split.removeprefix("panoptic_"), count, img_size=24, seed=3)
    return root


def outer_members(root, inner_extra: dict[str, bytes] | None = None) -> dict[str, bytes]:
    """The archive's members: the JSONs and each split's PNGs zipped again."""
    annotations = root / "annotations"
    members = {f"annotations/{folder}.json": (annotations / f"{folder}.json").read_bytes() for folder in COUNTS}
    for folder in COUNTS:
        pngs = {f"{folder}/{p.name}": p.read_bytes() for p in sorted((annotations / folder).glob("*.png"))}
        members[f"annotations/{folder}.zip"] = zipped(pngs | (inner_extra or {}))
    return members


@pytest.fixture
def script(server, monkeypatch, coco_files):
    """The script, its archive's MD5 and counts replaced by those of the tiny archive the server serves."""
    module = load_script("coco_panoptic")
    made = make_zip(server.root / module.ARCHIVE.path, outer_members(coco_files))
    monkeypatch.setattr(module, "ARCHIVE", dataclasses.replace(module.ARCHIVE, md5=md5_of(made)))
    monkeypatch.setattr(module, "COUNTS", dict(COUNTS))
    return module


def test_end_to_end_resumed_and_read_by_the_datamodule(script, server, coco_files, tmp_path, capsys):
    out = tmp_path / "coco"
    out.mkdir()
    # coco.py has recorded the images already: the record is kept, not overwritten
    earlier = {"dataset": "coco2017", "archives": {"val2017.zip": "abc"}, "counts": {"val2017": 2}}
    (out / ".data_scripts.json").write_text(json.dumps(earlier))
    server.drop_after[f"/{script.ARCHIVE.path}"] = 300  # the connection drops: the download resumes
    assert script.main(["--out", str(out), "--base-url", server.url]) == 0
    assert [r for _, r in server.requests] == [None, "bytes=300-"]
    annotations = out / "annotations"
    assert len(list((annotations / "panoptic_train2017").glob("*.png"))) == 3
    assert len(list((annotations / "panoptic_val2017").glob("*.png"))) == 2
    assert not list(annotations.glob("*.zip")) and not list(out.glob("*.zip"))  # inner zips and the archive gone
    marker = json.loads((out / ".data_scripts.json").read_text())
    assert marker["archives"] == {"val2017.zip": "abc", script.ARCHIVE.name: script.ARCHIVE.md5}
    assert marker["counts"] == {"val2017": 2, **COUNTS}
    capsys.readouterr()
    assert script.main(["--out", str(out), "--base-url", server.url]) == 0
    assert f"already present and verified: {out}" in capsys.readouterr().out and len(server.requests) == 2
    # with the images (data_scripts/coco.py's part) the DataModule reads the layout as it is
    shutil.copytree(coco_files / "val2017", out / "val2017")
    dm = CocoPanopticDataModule(root=str(out), img_size=24, loader=LoaderConfig(batch_size=1, num_workers=0))
    assert dm.class_names[:3] == ["disc", "square", "triangle"]
    dm.setup("validate")
    assert len(dm.val_dataset) == 2 and dm.val_dataset[1].eval_targets.masks.shape[1:] == dm.val_dataset[1].orig_sizes


def test_verify_names_what_is_missing(script, server, tmp_path, capsys):
    out = tmp_path / "coco"
    assert script.main(["--out", str(out), "--base-url", server.url]) == 0
    assert script.main(["--verify", str(out)]) == 0
    next((out / "annotations" / "panoptic_val2017").glob("*.png")).unlink()
    (out / "annotations" / "panoptic_train2017.json").unlink()
    assert script.main(["--verify", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{out / 'annotations' / 'panoptic_val2017'}: 1 files matching *.png, expected 2" in err
    assert f"{out / 'annotations' / 'panoptic_train2017.json'}: missing file" in err


def test_wrong_checksum_fails_with_the_file_named(script, server, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(script, "ARCHIVE", dataclasses.replace(script.ARCHIVE, md5="f" * 32))
    out = tmp_path / "coco"
    assert script.main(["--out", str(out), "--base-url", server.url]) == 1
    err = capsys.readouterr().err
    assert "panoptic_annotations_trainval2017.zip" in err and "expected " + "f" * 32 in err
    assert (out / "panoptic_annotations_trainval2017.zip.bad").is_file() and not (out / "annotations").exists()


def test_an_unsafe_inner_member_is_refused(script, server, coco_files, tmp_path, capsys, monkeypatch):
    made = make_zip(server.root / script.ARCHIVE.path, outer_members(coco_files, {"../../escaped.png": b"x"}))
    monkeypatch.setattr(script, "ARCHIVE", dataclasses.replace(script.ARCHIVE, md5=md5_of(made)))
    out = tmp_path / "coco"
    assert script.main(["--out", str(out), "--base-url", server.url]) == 1
    assert "member '../../escaped.png' climbs out of the target folder" in capsys.readouterr().err
    assert not (tmp_path / "escaped.png").exists() and not (out / "escaped.png").exists()


def test_help_lists_size_and_licence():
    text = help_text("coco_panoptic")
    for expected in ("panoptic_annotations_trainval2017.zip", "~820.2 MiB", "CC BY 4.0", "data_scripts/coco.py"):
        assert expected in text
