"""README's task contract, end to end as a user meets it: a task defined outside vitdense
(`tests/regression_task.py`: its own head, model, sample kind, prediction without an index
and result type with a file per image and a table) through the real commands — `fit`,
`predict` on a folder, `export` and a real `serve` — with every field each writes compared
with `vitdense.load`, the image sizes among them."""

import base64
import csv
import json
import os
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vitdense
from tests.test_readme import TINY
from tests.test_serve import running_server
from vitdense.cli import main

ROOT = Path(__file__).resolve().parents[1]
#: each photo's upright (H, W): one wider than high, one higher than wide, one turned by EXIF
PHOTOS = {"wide.png": (45, 70), "tall.jpg": (64, 30), "turned.jpg": (40, 56)}


def write_photos(folder: Path) -> None:
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name, (h, w) in PHOTOS.items():
        if name == "turned.jpg":  # stored W x H, EXIF orientation 6: shown turned a quarter clockwise
            exif = Image.Exif()
            exif[274] = 6
            Image.fromarray(rng.integers(0, 256, (w, h, 3), dtype=np.uint8)).save(folder / name, exif=exif)
        else:
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / name)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """ScoreTask fitted for two steps by `fit`: (the checkpoint, a folder of photos, vitdense.load's results)."""
    root = tmp_path_factory.mktemp("contract")
    data = {
        "class_path": "vitdense.data.SyntheticClassificationDataModule",
        "init_args": {"img_size": 32, "train_size": 8, "val_size": 4, "loader": {"batch_size": 4}},
    }
    model = {"class_path": "tests.regression_task.ScoreTask", "init_args": {"backbone": TINY}}
    config = root / "config.yaml"
    config.write_text(json.dumps({"model": model, "data": data}))
    args = ["fit", f"--config={config}", "--trainer.max_steps=2", "--trainer.limit_val_batches=1"]
    main([*args, f"--trainer.default_root_dir={root}", "--trainer.enable_progress_bar=false", "--trainer.logger=false"])
    (ckpt,) = (root / "checkpoints").glob("*.ckpt")
    photos = root / "photos"
    write_photos(photos)
    loaded = {Path(r.source).name: r for r in vitdense.load(ckpt)(photos)}
    return ckpt, photos, loaded


def test_load_gives_the_tasks_results_at_each_images_own_size(fitted):
    from tests.regression_task import ImageScore

    _, _, loaded = fitted
    assert {name: type(r) for name, r in loaded.items()} == dict.fromkeys(PHOTOS, ImageScore)
    assert {name: (r.height, r.width) for name, r in loaded.items()} == PHOTOS


def test_predict_writes_what_load_returns(fitted, tmp_path):
    ckpt, photos, loaded = fitted
    args = ["predict", f"--ckpt_path={ckpt}", f"--data.predict_dir={photos}", "--trainer.logger=false"]
    main([*args, f"--trainer.default_root_dir={tmp_path}", "--trainer.enable_progress_bar=false"])
    out = tmp_path / "predictions"
    rows = {Path(r["path"]).name: r for r in csv.DictReader((out / "scores.csv").open())}
    assert set(rows) == set(PHOTOS)
    for name, mine in loaded.items():
        row, written = rows[name], json.loads((out / "scores" / f"{Path(name).stem}.json").read_text())
        assert row["path"] == mine.source == written["source"]
        assert (int(row["height"]), int(row["width"])) == (mine.height, mine.width) == PHOTOS[name]
        assert written["size"] == [mine.height, mine.width]
        # the task's own sample (image + mirror image) reached predict_step in both
        assert float(row["score"]) == pytest.approx(mine.score, abs=1e-5)
        assert written["score"] == pytest.approx(mine.score, abs=1e-5)


def test_the_export_command_answers_as_load(fitted, tmp_path, capsys):
    import onnxruntime

    from vitdense.core.images import decode_image

    ckpt, photos, loaded = fitted
    main(["export", f"--ckpt_path={ckpt}", "--format=onnx", f"--output={tmp_path / 'score.onnx'}"])
    assert "score" in capsys.readouterr().out  # the model's own output name
    session = onnxruntime.InferenceSession(str(tmp_path / "score.onnx"), providers=["CPUExecutionProvider"])
    preprocess = vitdense.load(ckpt).data.preprocess
    mean, std = np.asarray(preprocess.mean)[:, None, None], np.asarray(preprocess.std)[:, None, None]
    for name, mine in loaded.items():
        image = preprocess(decode_image(photos / name)).numpy()  # what load feeds the model
        raw = ((image * std + mean) * 255).astype(np.float32)  # the graph normalises 0..255 itself
        (score,) = session.run(None, {"images": raw[None]})
        assert float(score[0]) == pytest.approx(mine.score, abs=1e-4)


def test_a_real_server_answers_what_load_returns(fitted, tmp_path):
    ckpt, photos, loaded = fitted
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with running_server(ckpt, tmp_path / "server.log", env=env) as url:
        for name, mine in loaded.items():
            body = json.dumps({"image": base64.b64encode((photos / name).read_bytes()).decode()}).encode()
            request = urllib.request.Request(f"{url}/predict", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as answer:
                got = json.loads(answer.read())
            assert got == {**mine.to_dict(), "score": got["score"], "source": None}  # sent as bytes: no file
            assert got["size"] == list(PHOTOS[name])
            assert got["score"] == pytest.approx(mine.score, abs=1e-5)
