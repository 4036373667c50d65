"""data_scripts/ade20k.py end to end from a tiny ADEChallengeData2016.zip served on 127.0.0.1 (its
--verify is tested with the ADE20K DataModule in tests/data/test_ade20k.py)."""

import dataclasses
import io
import json

import numpy as np
from PIL import Image

from tests.data_scripts.fakes import help_text, jpeg_bytes, load_script, make_zip, md5_of


def png_bytes(height: int, width: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.ones((height, width), np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_end_to_end_and_rerun(server, tmp_path, monkeypatch, capsys):
    script = load_script("ade20k")
    members = {}
    for split, prefix, n in (("training", "train", 2), ("validation", "val", 1)):
        for i in range(n):
            members[f"ADEChallengeData2016/images/{split}/ADE_{prefix}_{i:08d}.jpg"] = jpeg_bytes(i, (12, 10))
            members[f"ADEChallengeData2016/annotations/{split}/ADE_{prefix}_{i:08d}.png"] = png_bytes(10, 12)
    made = make_zip(server.root / script.ARCHIVE.path, members)
    monkeypatch.setattr(script, "ARCHIVE", dataclasses.replace(script.ARCHIVE, md5=md5_of(made)))
    monkeypatch.setattr(script, "COUNTS", {"training": 2, "validation": 1})
    out = tmp_path / "ade"
    assert script.main(["--out", str(out), "--base-url", server.url, "--deep"]) == 0
    root = out / "ADEChallengeData2016"
    assert len(list((root / "annotations" / "training").glob("*.png"))) == 2 and not (out / made.name).exists()
    assert json.loads((out / ".data_scripts.json").read_text())["archives"] == {made.name: md5_of(made)}
    capsys.readouterr()
    assert script.main(["--out", str(out), "--base-url", server.url]) == 0
    assert f"already present and verified: {out}" in capsys.readouterr().out and len(server.requests) == 1
    assert script.main(["--verify", str(root)]) == 0


def test_help_lists_size_and_terms():
    text = help_text("ade20k")
    for expected in ("ADEChallengeData2016.zip", "~922.6 MiB", "licence:", "research and educational", "--deep"):
        assert expected in text
