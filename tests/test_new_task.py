"""A task defined outside vitdense (README's "How to add a task" example, with its own
prediction and result types) runs through fit, `predict` (files) and `vitdense.load` with
no change inside the package: the one-declaration contract of `vitdense.results`. The real
`export` and `serve` commands run a second such task in `tests/test_task_contract.py`."""

import csv
import json

import numpy as np
import pytest
from PIL import Image

import vitdense
from tests.test_readme import TINY, as_module, code_blocks
from vitdense.cli import main


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """README's F1Task fitted for two steps through the CLI: (its module, the checkpoint, photos)."""
    monkeypatch = pytest.MonkeyPatch()
    (code,) = code_blocks("How to add a task")
    module = as_module("readme_new_task", code, monkeypatch)
    root = tmp_path_factory.mktemp("new_task")
    config = root / "config.yaml"
    data = {
        "class_path": "vitdense.data.SyntheticClassificationDataModule",
        "init_args": {"img_size": 32, "train_size": 8, "val_size": 4, "loader": {"batch_size": 4}},
    }
    model = {"class_path": "readme_new_task.F1Task", "init_args": {"backbone": TINY}}
    config.write_text(json.dumps({"model": model, "data": data}))  # JSON is YAML
    args = ["fit", "--config", str(config), "--trainer.max_steps=2", "--trainer.limit_val_batches=1"]
    main([*args, f"--trainer.default_root_dir={root}", "--trainer.enable_progress_bar=false", "--trainer.logger=false"])
    (ckpt,) = (root / "checkpoints").glob("*.ckpt")
    photos = root / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    for name, size in (("a.jpg", (40, 30)), ("b.png", (24, 50))):
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(photos / name)
    yield module, ckpt, photos
    monkeypatch.undo()


def test_load_returns_the_tasks_own_results(fitted):
    module, ckpt, photos = fitted
    predictor = vitdense.load(ckpt)
    results = predictor(photos)
    assert [type(r) for r in results] == [module.PickedClass] * 2
    assert [r.source for r in results] == [str(photos / "a.jpg"), str(photos / "b.png")]
    for result in results:
        assert result.name == predictor.class_names[result.label] and 0 < result.score <= 1
        assert result.to_dict()["task"] == "f1"
        json.dumps(result.to_dict())  # plain JSON


def test_predict_writes_the_tasks_table(fitted, tmp_path):
    module, ckpt, photos = fitted
    args = ["predict", f"--ckpt_path={ckpt}", f"--data.predict_dir={photos}", "--trainer.logger=false"]
    main([*args, f"--trainer.default_root_dir={tmp_path}", "--trainer.enable_progress_bar=false"])
    rows = list(csv.DictReader((tmp_path / "predictions" / "picked.csv").open()))
    by_path = {r.source: r for r in vitdense.load(ckpt)(photos)}
    assert sorted(r["path"] for r in rows) == sorted(by_path)
    for row in rows:  # the command line's numbers are the predictor's
        assert row["class"] == by_path[row["path"]].name
        assert float(row["score"]) == pytest.approx(by_path[row["path"]].score, abs=2e-6)
