"""A trained model is used without the trainer: `vitdense.load`, `load_model`, `python -m
vitdense export` and `serve` rebuild each built-in family's plain model from what its
checkpoint records (`vitdense.deploy.checkpoint.record_model`) without importing Lightning,
torchmetrics, scipy or the task classes, and give exactly what the task restored through
Lightning gives; a checkpoint without the record (written before it, or by a task of your
own) still loads, through Lightning."""

import json
import subprocess
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

import vitdense
from vitdense.deploy.checkpoint import MODEL_KEY, Checkpoint, PlainTask, load_model, load_weights_into, record_model
from vitdense.deploy.predictor import Predictor, inference_data

#: what a process that uses a trained model must not import (sympy too, where torch and timm do not)
TRAINER_MODULES = ("lightning", "torchmetrics", "scipy", "sympy", "vitdense.tasks", "vitdense.training", "vitdense.cli")


#: the synthetic data of the families fitted here: as small as they come
SMALL = {"img_size": 32, "train_size": 2, "val_size": 2}


def images() -> list[np.ndarray]:
    """Two images of other sizes than the training's (padded into one batch)."""
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (40, 52, 3), dtype=np.uint8), rng.integers(0, 256, (29, 23, 3), dtype=np.uint8)]


def as_json(results) -> list:
    return [json.loads(json.dumps(r.to_dict())) for r in results]


@pytest.fixture(scope="module")
def checkpoints(trained, tmp_path_factory) -> dict[str, Path]:
    """A tiny checkpoint of every built-in family: the CLI demos' (classification, Segmenter,
    DETR) and one training step of a linear probe (its second head the best), EoMT (panoptic,
    thresholds low enough that segments are found), DPT (inverse depth, DPT's blocks for its
    backbone) and MAE, each on its synthetic data."""
    import lightning as L

    from vitdense.data import LoaderConfig
    from vitdense.data.synthetic.classification import SyntheticClassificationDataModule
    from vitdense.data.synthetic.depth import SyntheticDepthDataModule
    from vitdense.data.synthetic.universal import SyntheticPanopticDataModule
    from vitdense.heads.dpt import DPTHead
    from vitdense.heads.eomt import EoMTHead
    from vitdense.pretrain import MaskedAutoencoder
    from vitdense.tasks import (
        BackboneConfig,
        DepthTask,
        LinearProbeTask,
        MaskedImageModelingTask,
        UniversalSegmentationTask,
    )

    root = tmp_path_factory.mktemp("families")
    loader = LoaderConfig(batch_size=2, num_workers=0)

    def tiny(depth: int) -> BackboneConfig:
        return BackboneConfig(name="vit_tiny_patch16_224", img_size=32, model_args={"depth": depth})

    def fit(name: str, task: L.LightningModule, data: L.LightningDataModule) -> Path:
        trainer = L.Trainer(
            max_steps=1, limit_val_batches=0, num_sanity_val_steps=0, accelerator="cpu", logger=False,
            enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
            default_root_dir=root / name,
        )  # fmt: skip
        trainer.fit(task, datamodule=data)
        trainer.save_checkpoint(root / f"{name}.ckpt")
        return root / f"{name}.ckpt"

    classes = partial(SyntheticClassificationDataModule, img_size=32, train_size=4, val_size=2, loader=loader)
    out = {name: trained[name][1] for name in ("cls", "seg", "det")}
    out["probe"] = fit(
        "probe", LinearProbeTask(4, lrs=[0.1, 0.01], n_last_blocks=2, avgpool=True, backbone=tiny(2)), classes()
    )
    state = torch.load(out["probe"], map_location="cpu", weights_only=True)
    state["state_dict"]["model.best_head"] = torch.tensor(1)  # (as if the second head had validated best)
    torch.save(state, out["probe"])
    eomt = UniversalSegmentationTask(
        6, head=partial(EoMTHead, num_queries=6, num_blocks=1), backbone=tiny(2), score_threshold=0.1,
        overlap_threshold=0.2,
    )  # fmt: skip
    out["eomt"] = fit("eomt", eomt, SyntheticPanopticDataModule(root=str(root / "panoptic"), **SMALL, loader=loader))
    depth = DepthTask(
        head=partial(DPTHead, features=8, out_channels=[8, 8, 8, 8]), output="inverse", inverse_scale=0.5,
        inverse_shift=0.1, backbone=tiny(4),
    )  # fmt: skip
    out["depth"] = fit("depth", depth, SyntheticDepthDataModule(root=str(root / "rooms"), **SMALL, loader=loader))
    mae = partial(MaskedAutoencoder, decoder_embed_dim=32, decoder_depth=1, decoder_num_heads=2)
    out["mae"] = fit("mae", MaskedImageModelingTask(objective=mae, backbone=tiny(1)), classes())
    return out


#: run in a new process: every checkpoint predicted with `vitdense.load`, the server's API and
#: `python -m vitdense export`, then what was imported
SCRIPT = """
import json, runpy, sys
import torch, timm
baseline = [m for m in sys.argv[4:] if m in sys.modules]  # (what torch and timm import themselves)
torch.set_num_threads(int(sys.argv[3]))
import numpy as np
import vitdense
from vitdense.deploy.serve import PredictorAPI

rng = np.random.default_rng(0)
images = [rng.integers(0, 256, (40, 52, 3), dtype=np.uint8), rng.integers(0, 256, (29, 23, 3), dtype=np.uint8)]
out = {}
for name, ckpt in json.loads(sys.argv[1]).items():
    if name == "mae":
        out[name] = type(vitdense.load_model(ckpt)).__name__
        continue
    predictor = vitdense.load(ckpt)
    out[name] = [type(predictor.task).__name__] + [r.to_dict() for r in predictor(images)]
api = PredictorAPI(json.loads(sys.argv[1])["det"], max_batch_size=2)
api.setup("cpu")
out["serve"] = api.encode_response(api.predict(images[0]))
sys.argv = ["vitdense", "export", "--ckpt_path", json.loads(sys.argv[1])["mae"], "--format", "weights",
            "--output", sys.argv[2]]
try:
    runpy.run_module("vitdense", run_name="__main__")
except SystemExit as exit:
    assert not exit.code, exit.code
out["imported"] = [m for m in sys.argv[4:] if m in sys.modules and m not in baseline]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def through_lightning(checkpoints) -> dict:
    """Each checkpoint's task restored through Lightning (as before the record), in evaluation mode."""
    return {name: Checkpoint(path).restore().eval() for name, path in checkpoints.items()}


def test_a_new_process_predicts_every_family_without_lightning_as_lightning_does(
    checkpoints, through_lightning, tmp_path
):
    """In a fresh Python, `vitdense.load(ckpt)(images)` of every family, the server's API and
    `python -m vitdense export` leave Lightning, torchmetrics, scipy (and sympy, where torch
    and timm do not import it), the tasks and the command line unimported; every result
    equals, field for field, the one of the task restored through Lightning."""
    paths = {name: str(path) for name, path in checkpoints.items()}
    weights = tmp_path / "mae.safetensors"
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(paths), str(weights), str(torch.get_num_threads()), *TRAINER_MODULES],
        capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got.pop("imported") == []
    assert got.pop("mae") == "MaskedImageModel" and weights.is_file()
    for name, path in paths.items():
        if name == "mae":
            continue
        assert Checkpoint(path).model_record is not None, name
        task, *results = got[name]
        assert task == "PlainTask"
        expected = Predictor(through_lightning[name], inference_data(Checkpoint(path)))
        assert results == as_json(expected(images())), name
        if name == "det":
            assert got["serve"] == as_json([expected(images()[0])])[0]


def test_every_kind_of_universal_segmentation_and_linear_probe_predict_as_their_tasks(checkpoints, through_lightning):
    """EoMT's panoptic, instance and semantic predictions (one checkpoint, the task's setting
    changed as `--model.init_args.segmentation` changes it), and the linear probe's best head,
    equal the tasks'."""
    found = Checkpoint(checkpoints["eomt"])
    plain, task = found.restore_plain(), through_lightning["eomt"]
    data = inference_data(found)
    assert any(len(r.ids) for r in Predictor(plain, data)(images()))  # (segments found: a comparison worth making)
    try:
        for kind in ("panoptic", "instance", "semantic"):
            plain.inference = replace(plain.inference, segmentation=kind)
            task.segmentation = kind
            assert as_json(Predictor(plain, data)(images())) == as_json(Predictor(task, data)(images())), kind
    finally:
        task.segmentation = "panoptic"
    found = Checkpoint(checkpoints["probe"])
    plain = found.restore_plain()
    assert int(plain.model.best_head) == 1
    expected = as_json(Predictor(through_lightning["probe"], inference_data(found))(images()))
    assert as_json(Predictor(plain, inference_data(found))(images())) == expected


def test_load_model_equals_the_tasks_model(checkpoints, through_lightning, monkeypatch):
    """`load_model` without Lightning: the task's plain model, every tensor equal, in
    evaluation mode (the pre-training's `MaskedImageModel` too, whose backbone `export
    --format weights` writes), built once, with its parameters on the meta device (no random
    initialisation for the checkpoint's weights to replace)."""
    import vitdense.deploy.checkpoint as deploy

    built = []

    def build_once(build, state_dict):
        def counted():
            model = build()
            built.append(next(model.parameters()).is_meta)
            return model

        return load_weights_into(counted, state_dict)

    monkeypatch.setattr(deploy, "load_weights_into", build_once)
    for name, path in checkpoints.items():
        built.clear()
        model, theirs = load_model(path), through_lightning[name].model
        assert built == [True], name
        assert type(model) is type(theirs) and not model.training, name
        assert list(model.state_dict()) == list(theirs.state_dict()), name
        assert all(torch.equal(v, theirs.state_dict()[k]) for k, v in model.state_dict().items()), name


def test_a_checkpoint_without_the_record_loads_through_lightning(trained, tmp_path):
    """A checkpoint written before the model record (here: the demo's, the record removed)
    restores its task through Lightning, and predicts what the record's plain model does."""
    _, ckpt = trained["det"]
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    del state[MODEL_KEY]
    older = tmp_path / "older.ckpt"
    torch.save(state, older)
    before, now = vitdense.load(older), vitdense.load(ckpt)
    assert type(before.task).__name__ == "DetectionTask" and isinstance(now.task, PlainTask)
    assert as_json(before(images())) == as_json(now(images()))


def test_only_a_class_that_declares_its_inference_records_it():
    """A built-in task records its model; a subclass of one (which may predict otherwise) and
    a task written to README's contract do not: their checkpoints load through Lightning."""
    from vitdense.tasks import BackboneConfig, ClassificationTask
    from vitdense.tasks.base import BaseTask

    class Mine(ClassificationTask):
        pass

    class Own(BaseTask):
        pass

    backbone = BackboneConfig(name="vit_tiny_patch16_224", img_size=32, model_args={"depth": 1})
    recorded = {}
    record_model(recorded, ClassificationTask(3, backbone=backbone))
    assert recorded[MODEL_KEY]["inference"] == {
        "class_path": "vitdense.models.classification.ClassifierInference",
        "init_args": {"num_classes": 3},
    }
    assert recorded[MODEL_KEY]["backbone"]["checkpoint"] is None and recorded[MODEL_KEY]["class_names"] == list("012")
    for task in (Mine(3, backbone=backbone), Own(3, head=ClassificationTask(3, backbone=backbone).head_spec)):
        recorded = {}
        record_model(recorded, task)
        assert recorded == {}, type(task).__name__
