"""data_scripts/imagenet.py from tiny tars in the official layout: a devkit with meta.mat (scipy.io.savemat)
and the validation ground truth, a training tar of per-class tars, a flat validation tar."""

import dataclasses
import io
import json

import numpy as np
import pytest
import scipy.io

from tests.data_scripts.fakes import help_text, jpeg_bytes, load_script, make_tar, md5_of

#: (ILSVRC2012_ID, WNID, words, num_children): three classes and a parent synset
SYNSETS = [
    (1, "n01440764", "tench", 0),
    (2, "n01443537", "goldfish", 0),
    (3, "n01484850", "great white shark", 0),
    (4, "n02512053", "fish", 2),
]
VAL_IDS = [2, 1, 3, 2, 1]  # the class of ILSVRC2012_val_00000001 ... 00000005


def devkit_bytes(ids=VAL_IDS) -> dict[str, bytes]:
    fields = [("ILSVRC2012_ID", "O"), ("WNID", "O"), ("words", "O"), ("num_children", "O")]
    synsets = np.array(SYNSETS, dtype=fields).reshape(-1, 1)
    meta = io.BytesIO()
    scipy.io.savemat(meta, {"synsets": synsets})
    truth = "".join(f"{i}\n" for i in ids).encode()
    return {
        "ILSVRC2012_devkit_t12/data/meta.mat": meta.getvalue(),
        "ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt": truth,
    }


@pytest.fixture
def tars(tmp_path, monkeypatch):
    """(the script with the tiny tars' MD5s and counts, the folder of the tars)."""
    script = load_script("imagenet")
    folder = tmp_path / "tars"
    inner = {}
    for n, (_, wnid, _, children) in enumerate(SYNSETS):
        if children == 0:
            images = {f"{wnid}_{k}.JPEG": jpeg_bytes(10 * n + k) for k in range(2)}
            inner[f"{wnid}.tar"] = make_tar(tmp_path / "classes" / f"{wnid}.tar", images).read_bytes()
    made = {
        "train": make_tar(folder / "ILSVRC2012_img_train.tar", inner),
        "val": make_tar(
            folder / "ILSVRC2012_img_val.tar",
            {f"ILSVRC2012_val_{i:08d}.JPEG": jpeg_bytes(100 + i) for i in range(1, len(VAL_IDS) + 1)},
        ),
        "devkit": make_tar(folder / "ILSVRC2012_devkit_t12.tar.gz", devkit_bytes(), mode="w:gz"),
    }
    for key, path in made.items():
        monkeypatch.setitem(script.ARCHIVES, key, dataclasses.replace(script.ARCHIVES[key], md5=md5_of(path)))
    monkeypatch.setitem(script.COUNTS, "train", 6)
    monkeypatch.setitem(script.COUNTS, "val", len(VAL_IDS))
    return script, folder


def listing(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.JPEG"))


def test_end_to_end(tars, tmp_path, capsys):
    script, folder = tars
    out = tmp_path / "imagenet"
    assert script.main(["--tars", str(folder), "--out", str(out), "--no-skip-checksums"]) == 0
    assert listing(out / "val") == [
        "n01440764/ILSVRC2012_val_00000002.JPEG",
        "n01440764/ILSVRC2012_val_00000005.JPEG",
        "n01443537/ILSVRC2012_val_00000001.JPEG",
        "n01443537/ILSVRC2012_val_00000004.JPEG",
        "n01484850/ILSVRC2012_val_00000003.JPEG",
    ]
    assert listing(out / "train") == [
        f"{w}/{w}_{k}.JPEG" for w in ("n01440764", "n01443537", "n01484850") for k in (0, 1)
    ]
    assert json.loads((out / ".data_scripts.json").read_text())["counts"] == {"train": 6, "val": 5}
    assert sorted(p.name for p in folder.iterdir()) == sorted(a.name for a in script.ARCHIVES.values())  # kept
    capsys.readouterr()
    assert script.main(["--tars", str(folder), "--out", str(out)]) == 0
    assert f"already present and verified: {out}" in capsys.readouterr().out
    assert script.main(["--verify", str(out)]) == 0
    (out / "val" / "n01440764" / "ILSVRC2012_val_00000002.JPEG").unlink()
    assert script.main(["--verify", str(out), "--splits", "val"]) == 1
    assert f"{out / 'val'}: 4 files matching */*.JPEG, expected 5" in capsys.readouterr().err


def test_missing_tar_says_where_to_get_it(tars, tmp_path, capsys):
    script, folder = tars
    (folder / "ILSVRC2012_img_val.tar").unlink()
    assert script.main(["--tars", str(folder), "--out", str(tmp_path / "out"), "--splits", "val"]) == 1
    err = capsys.readouterr().err
    assert f"{folder / 'ILSVRC2012_img_val.tar'} (~" in err and ": not found" in err
    assert "without an account" in err and "https://image-net.org/download-images.php" in err


def test_every_missing_tar_is_named_before_anything_is_extracted(tars, tmp_path, capsys):
    script, folder = tars
    for name in ("ILSVRC2012_img_val.tar", "ILSVRC2012_devkit_t12.tar.gz"):
        (folder / name).unlink()
    out = tmp_path / "out"
    assert script.main(["--tars", str(folder), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "ILSVRC2012_img_val.tar (~" in err and "ILSVRC2012_devkit_t12.tar.gz (~" in err
    assert "ILSVRC2012_img_train.tar" not in err.split("not found")[0]  # present: not named
    assert not (out / "train").exists()  # the training tar was not extracted first


def test_bad_devkit_and_unsafe_inner_tar_are_refused(tars, tmp_path, capsys, monkeypatch):
    script, folder = tars
    devkit = make_tar(folder / "ILSVRC2012_devkit_t12.tar.gz", devkit_bytes([1, 4]), mode="w:gz")
    monkeypatch.setitem(script.ARCHIVES, "devkit", dataclasses.replace(script.ARCHIVES["devkit"], md5=md5_of(devkit)))
    assert script.main(["--tars", str(folder), "--out", str(tmp_path / "out"), "--splits", "val"]) == 1
    assert "line 2 names ILSVRC2012_ID 4, which is not one of the 3 leaf synsets" in capsys.readouterr().err
    evil = make_tar(tmp_path / "evil.tar", {"../../escaped.JPEG": jpeg_bytes(0)}).read_bytes()
    make_tar(folder / "ILSVRC2012_img_train.tar", {"n01440764.tar": evil})
    assert script.main(["--tars", str(folder), "--out", str(tmp_path / "out"), "--splits", "train"]) == 1
    assert "ILSVRC2012_img_train.tar:n01440764.tar: member '../../escaped.JPEG'" in capsys.readouterr().err
    assert not list(tmp_path.rglob("escaped.JPEG"))
    # --no-skip-checksums catches a tar that is not the official one
    assert script.main(["--tars", str(folder), "--out", str(tmp_path / "out"), "--no-skip-checksums"]) == 1
    assert "ILSVRC2012_img_train.tar: MD5" in capsys.readouterr().err


def test_help_lists_sizes_and_terms():
    text = help_text("imagenet")
    for expected in ("~137.7 GiB", "~6.3 GiB", "ILSVRC2012_devkit_t12.tar.gz", "terms of access", "--skip-checksums"):
        assert expected in text
