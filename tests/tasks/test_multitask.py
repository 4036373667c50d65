"""MultiTask: segmentation and depth trained on one encoder from their own DataModules.

What is checked against the single tasks (not against itself): the training loss is the
weighted sum of each task's own loss on its own batch, and each task's validation figures
equal that task validated alone with the same weights."""

import base64
import io
import json
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
import yaml
from PIL import Image

import vitdense
from vitdense.backbone import VisionTransformer
from vitdense.cli import main
from vitdense.core.errors import ConfigError
from vitdense.data import LoaderConfig, SyntheticDepthDataModule, SyntheticSegmentationDataModule
from vitdense.data.multitask import MultiTaskDataModule
from vitdense.data.synthetic.multitask import SyntheticScenesDataModule, labeled_scene
from vitdense.data.transforms.common import normalization
from vitdense.deploy.checkpoint import Checkpoint, load_model, load_task
from vitdense.deploy.export import export_checkpoint, exportable, run_exported
from vitdense.deploy.multitask import MultiTaskPredictor
from vitdense.deploy.multitask import normalization as normalization_of
from vitdense.deploy.serve import PredictorAPI
from vitdense.deploy.slicing import Slicing
from vitdense.heads import DETRHead, DPTHead, LinearDecoder
from vitdense.models import MultiTaskModel
from vitdense.tasks import BackboneConfig, DepthTask, DetectionTask, SegmentationTask
from vitdense.tasks.multitask import MultiTask, check_data

TINY = BackboneConfig(name="vit_tiny_patch16_224", img_size=32, model_args={"depth": 4})
DPT = partial(DPTHead, features=16, out_channels=(8, 8, 16, 16))
DETR_TINY = {"hidden_dim": 32, "num_heads": 2, "dim_feedforward": 64, "num_queries": 5, "dec_layers": 1}


def tasks(backbone: BackboneConfig = TINY) -> dict:
    """Segmentation and depth, each built from seed 0: their encoders start equal, as two
    tasks' encoders from one pretrained file do."""
    torch.manual_seed(0)
    seg = SegmentationTask(num_classes=4, head=LinearDecoder, backbone=backbone)
    torch.manual_seed(0)
    return {"seg": seg, "depth": DepthTask(head=DPT, backbone=backbone, max_depth=10.0)}


def data(tmp_path) -> dict:
    loader = LoaderConfig(batch_size=4, num_workers=0)
    return {
        "seg": SyntheticSegmentationDataModule(img_size=32, train_size=8, val_size=4, loader=loader),
        "depth": SyntheticDepthDataModule(
            root=str(tmp_path / "depth"), img_size=32, train_size=4, val_size=4, loader=loader
        ),
    }


def trainer(tmp_path, **kwargs) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
        **kwargs,
    )


def test_one_encoder_is_shared_and_stored_once():
    model = MultiTask(tasks())
    assert all(t.model.backbone is model.backbone for t in model.tasks.values())
    n_encoder = sum(p.numel() for p in model.backbone.parameters())
    assert (
        sum(p.numel() for p in model.parameters())
        < sum(sum(p.numel() for p in t.parameters()) for t in tasks().values()) - n_encoder + 1
    )  # (the second encoder is gone)
    state = model.state_dict()
    assert any(k.startswith("backbone.") for k in state)
    assert not any(".model.backbone." in k for k in state)
    again = MultiTask(tasks(BackboneConfig(name="vit_tiny_patch16_224", img_size=32, model_args={"depth": 4})))
    torch.nn.init.zeros_(again.backbone.blocks[0].attn.qkv.weight)
    again.load_state_dict(state)
    images = torch.randn(2, 3, 32, 32)
    model.eval(), again.eval()
    for name, out in model(images).items():
        torch.testing.assert_close(again(images)[name], out, rtol=0, atol=0)


HYBRID = BackboneConfig(name="vit_tiny_r_s16_p8_224", img_size=32, model_args={"depth": 4, "patch_size": 2})


def three_tasks(backbone: BackboneConfig = HYBRID) -> MultiTask:
    """Detection (DETR), segmentation (Segmenter's linear decoder) and depth (DPT: four raw
    blocks) on one hybrid encoder: the heads ask the encoder for different things."""
    torch.manual_seed(0)
    det = DetectionTask(num_classes=3, head=partial(DETRHead, **DETR_TINY), backbone=backbone)
    seg = SegmentationTask(num_classes=4, head=LinearDecoder, backbone=backbone)
    depth = DepthTask(head=DPT, backbone=backbone, max_depth=10.0)
    return MultiTask({"det": det, "seg": seg, "depth": depth}).eval()


def as_tensors(output) -> list[torch.Tensor]:
    return [output] if torch.is_tensor(output) else [x for x in output if torch.is_tensor(x)]


def test_one_encoder_pass_answers_every_head_as_it_runs_alone():
    """Inside the multi-task forward the encoder runs once, with the union of what the heads
    read, and every head's output is the one its task gives alone, to the bit (fp32)."""
    model = three_tasks()
    images = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        alone = {name: task(images) for name, task in model.tasks.items()}
        with model.backbone.one_pass() as shared:
            joint = model(images)
        assert (shared.encoded, shared.answered) == (1, 2)
        for name, out in alone.items():
            for a, b in zip(as_tensors(out), as_tensors(joint[name]), strict=True):
                torch.testing.assert_close(b, a, rtol=0, atol=0, msg=name)
        plain = MultiTaskModel({name: task.model for name, task in model.tasks.items()})
        assert plain.export_names == ("det.boxes", "det.scores", "det.labels", "seg.logits", "depth.depth")
        with plain.backbone.one_pass() as shared:
            exported = plain.export_outputs(images)
        assert shared.encoded == 1
        singles = [out for task in model.tasks.values() for out in task.model.export_outputs(images)]
        for a, b in zip(singles, exported, strict=True):
            torch.testing.assert_close(b, a, rtol=0, atol=0)
        # other images, or a block nobody declared: a new pass (never an answer it did not compute)
        with model.backbone.one_pass() as shared:
            model(images)
            model.backbone(images.clone())  # equal values: answered
            model.backbone(images + 1)
            model.backbone(images, intermediates=(0,), norm_intermediates=True)  # declared by DPT: answered
        assert (shared.encoded, shared.answered) == (2, 4)


def test_tasks_on_the_same_images_train_from_one_pass():
    """A training step whose tasks hold the same images (one dataset, several kinds of
    labels) encodes them once; the encoder's gradient is the sum of the tasks' gradients
    through separate passes."""
    model = three_tasks().train()
    images = torch.randn(2, 3, 32, 32)

    def loss(output) -> torch.Tensor:
        return sum(x.float().square().mean() for x in as_tensors(output) if x.is_floating_point())

    def grads(shared: bool) -> list[torch.Tensor]:
        model.zero_grad()
        torch.manual_seed(1)
        with model.backbone.one_pass(model.encoder_request) if shared else nullcontext() as passes:
            total = sum(loss(task(images)) for task in model.tasks.values())
        total.backward()
        if shared:
            assert passes.encoded == 1
        return [p.grad.clone() for p in model.backbone.parameters() if p.grad is not None]

    for a, b in zip(grads(False), grads(True), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_fit_logs_each_task_and_equals_the_tasks_alone(tmp_path):
    """Two steps of joint training, then validation: each task's figures under its name equal
    that task validated alone on the same weights; `val/loss` is their weighted sum; the first
    training loss is the weighted sum of the tasks' own losses on their batches."""
    model = MultiTask(tasks(), loss_weights={"seg": 1.0, "depth": 0.5})
    datamodule = MultiTaskDataModule(data(tmp_path))
    datamodule.trainer = trainer(tmp_path)
    datamodule.setup("fit")
    batches = next(iter(datamodule.train_dataloader()))[0]  # CombinedLoader: (batch, batch_idx, dataloader_idx)
    expected = sum(
        w * model.tasks[n].compute_loss(model.tasks[n].forward_batch(batches[n], "train"), batches[n], "train").total
        for n, w in (("seg", 1.0), ("depth", 0.5))
    )
    run = trainer(tmp_path, max_steps=2, limit_val_batches=1)
    first = {}

    class First(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            first.setdefault("loss", outputs["loss"].detach())

    run.callbacks.append(First())
    run.fit(model, datamodule=MultiTaskDataModule(data(tmp_path)))
    torch.testing.assert_close(first["loss"], expected.detach(), rtol=1e-5, atol=1e-6)
    logged = run.callback_metrics
    for key in ("train/seg/loss", "train/depth/loss", "val/seg/mIoU", "val/seg/loss", "val/depth/abs_rel", "val/loss"):
        assert key in logged, key
    torch.testing.assert_close(logged["val/loss"], logged["val/seg/loss"] + 0.5 * logged["val/depth/loss"])

    for name, data_alone in data(tmp_path).items():
        alone = trainer(tmp_path, limit_val_batches=1)
        (figures,) = alone.validate(model.tasks[name], datamodule=data_alone, verbose=False)
        for key, value in figures.items():
            joint = logged[key.replace("val/", f"val/{name}/", 1)]
            assert joint == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_uncertainty_weighting_is_kendalls():
    model = MultiTask(tasks(), weighting="uncertainty")
    with torch.no_grad():
        model.log_vars.copy_(torch.tensor([0.5, -1.0]))
    losses = {"seg": torch.tensor(2.0), "depth": torch.tensor(3.0)}
    expected = torch.exp(torch.tensor(-0.5)) * 2.0 + 0.5 + torch.exp(torch.tensor(1.0)) * 3.0 - 1.0
    torch.testing.assert_close(model.combine(losses), expected)
    assert any(g.get("names") == ["log_vars"] for g in model.param_groups())


def test_parameter_groups_hold_each_parameter_once():
    model = MultiTask(tasks(), task_lr_scale={"depth": 0.1})
    groups = model.param_groups()
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len([p for p in model.parameters() if p.requires_grad])
    depth_head = {id(p) for p in model.tasks["depth"].head.parameters()}
    for g in groups:
        if any(id(p) in depth_head for p in g["params"]):
            assert g["lr_scale"] == pytest.approx(0.1)


def test_bad_configurations_are_one_line(tmp_path):
    other = DepthTask(
        head=DPT, backbone=BackboneConfig(name="vit_tiny_patch16_224", img_size=48, model_args={"depth": 4})
    )
    with pytest.raises(
        ConfigError, match=r"tasks.other.init_args.backbone differs.*img_size: 32 vs 48.*share one encoder"
    ):
        MultiTask(tasks() | {"other": other})
    with pytest.raises(ConfigError, match="not tasks"):
        MultiTask(tasks(), loss_weights={"sge": 1.0})
    with pytest.raises(ConfigError, match="is not a name"):
        MultiTask({"my task": tasks()["seg"]})
    with pytest.raises(ConfigError, match=r"tasks without data: \['depth'\]"):
        MultiTaskDataModule({"seg": data(tmp_path)["seg"]}).check_tasks(["seg", "depth"])
    larger = SyntheticSegmentationDataModule(img_size=48, train_size=8, val_size=4)
    with pytest.raises(ConfigError, match=r"tasks.seg.init_args.img_size=48, but the shared encoder's .* is 32"):
        check_data("seg", tasks()["seg"], larger)


DEMO = Path(__file__).parents[2] / "configs" / "demo_multitask.yaml"


def demo_yaml(tmp_path, seg_classes: int = 4) -> str:
    """configs/demo_multitask.yaml (detection, segmentation and depth on one encoder, from
    co-annotated scenes) on tiny sets for two steps: test_configs.py runs every other recipe;
    this one runs here."""
    config = yaml.safe_load(DEMO.read_text())
    config["trainer"] |= {
        "max_steps": 2,
        "limit_val_batches": 1,
        "val_check_interval": 2,
        "num_sanity_val_steps": 0,
        "enable_progress_bar": False,
        "logger": False,
        "default_root_dir": str(tmp_path / "run"),
        "callbacks": [],
    }
    config["data"]["init_args"] |= {
        "img_size": 32,
        "train_size": 4,
        "val_size": 2,
        "loader": {"batch_size": 2, "num_workers": 0},
    }
    for task in config["model"]["init_args"]["tasks"].values():
        task["init_args"]["backbone"] = {**task["init_args"]["backbone"], "img_size": 32}
    config["model"]["init_args"]["tasks"]["seg"]["init_args"]["num_classes"] = seg_classes
    path = tmp_path / f"multitask_{seg_classes}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return str(path)


def test_the_command_line_fits_a_multitask_config(tmp_path, capsys, monkeypatch):
    """The demo: three tasks on co-annotated scenes, each step's images encoded ONCE for the
    three heads; then `predict` and `vitdense.load` of its checkpoint."""
    encode, passes = VisionTransformer.encode, []

    def counted(self, *args, **kwargs):
        passes.append(torch.is_grad_enabled())
        return encode(self, *args, **kwargs)

    monkeypatch.setattr(VisionTransformer, "encode", counted)
    cli = main(["fit", "--config", demo_yaml(tmp_path)])
    assert sum(passes) == cli.trainer.global_step == 2  # (with grad: the training steps' passes)
    monkeypatch.undo()
    model, data = cli.model, cli.datamodule
    assert isinstance(model, MultiTask) and list(data.tasks) == ["det", "seg", "depth"]
    assert all(task.backbone is model.backbone for task in model.tasks.values())
    assert cli.trainer.global_step == 2
    for key in ("val/det/map_50", "val/seg/mIoU", "val/depth/abs_rel", "val/loss", "train/det/loss_giou"):
        assert key in cli.trainer.callback_metrics, key
    # the first task's encoder name reached every task's data: its pretraining mean and std
    assert data.tasks["depth"].mean == pytest.approx(normalization("vit_tiny_r_s16_p8_224")[0])

    # predict on a folder: each task's files and table under its name, as vitdense.load answers
    ckpt = next((tmp_path / "run").rglob("*.ckpt"))
    folder = tmp_path / "photos"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i, size in enumerate([(32, 32), (40, 52)]):
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(folder / f"photo{i}.png")
    out = tmp_path / "predicted"
    predict = ["predict", "--config", demo_yaml(tmp_path), "--ckpt_path", str(ckpt), "--trainer.precision=32-true"]
    main([*predict, f"--data.init_args.predict_dir={folder}", f"--trainer.default_root_dir={out}"])
    results = vitdense.load(ckpt)(folder)
    rows = json.loads((out / "predictions" / "det" / "detections.json").read_text())
    expected = [row for result in results for row in result["det"].rows()]
    assert len(rows) == len(expected) > 0
    for got, want in zip(rows, expected, strict=True):
        assert got["category_id"] == want["category_id"] and got["score"] == pytest.approx(want["score"])
        assert got["bbox"] == pytest.approx(want["bbox"], abs=1e-3)
    # tiles for the task that predicts objects, whole images for the others
    sliced = vitdense.load(ckpt, slicing=Slicing(slice_height=16, slice_width=16))
    assert [name for name, p in sliced.predictors.items() if p.slicing is not None] == ["det"]
    tiled = sliced(folder / "photo1.png")
    assert type(tiled["det"]).__name__ == "DetectionResult" and tiled["seg"].to_dict() == results[1]["seg"].to_dict()
    for i, result in enumerate(results):
        written = np.array(Image.open(out / "predictions" / "seg" / "masks" / f"photo{i}.png"))
        np.testing.assert_array_equal(written, result["seg"].label_map)
        assert (out / "predictions" / "depth" / "depth" / f"photo{i}.png").is_file()
    with pytest.raises(SystemExit):
        main(["fit", "--config", demo_yaml(tmp_path, seg_classes=5)])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        "vitdense: error: model.init_args.tasks.seg.init_args.num_classes=5, but data.init_args.tasks.seg has 4 "
        "classes: set it to 4"
    )


def test_a_checkpoint_rebuilds_the_tasks(tmp_path):
    """A MultiTask's checkpoint holds each task as plain data: it loads alone, from its file,
    without the objects that built it, and answers as the model that wrote it."""
    model = MultiTask(tasks(), loss_weights={"seg": 2.0, "depth": 1.0}).eval()
    run = trainer(tmp_path, max_steps=1, limit_val_batches=0)
    run.fit(model, datamodule=MultiTaskDataModule(data(tmp_path)))
    run.save_checkpoint(tmp_path / "joint.ckpt")
    state = torch.load(tmp_path / "joint.ckpt", map_location="cpu", weights_only=True)
    assert state["hyper_parameters"]["_class_path"] == "vitdense.tasks.multitask.MultiTask"
    assert set(state["hyper_parameters"]["tasks"]) == {"seg", "depth"}
    loaded = MultiTask.load_from_checkpoint(tmp_path / "joint.ckpt", weights_only=True).eval()
    assert loaded.loss_weights == {"seg": 2.0, "depth": 1.0}
    images = torch.randn(2, 3, 32, 32)
    for name, out in model.eval()(images).items():
        torch.testing.assert_close(loaded(images)[name], out, rtol=0, atol=0)


def test_heads_trained_apart_on_a_frozen_encoder_combine(tmp_path, capsys):
    """Two single tasks trained on one frozen encoder (the same starting weights), each from its
    own data, combine without training into one checkpoint whose tasks answer exactly as the
    single checkpoints do; an encoder that moved is refused, naming its file."""
    frozen = BackboneConfig(name="vit_tiny_patch16_224", img_size=32, model_args={"depth": 4}, freeze=True)
    written = {}
    for name, task in tasks(frozen).items():
        run = trainer(tmp_path / name, max_steps=1, limit_val_batches=0)
        run.fit(task, datamodule=data(tmp_path)[name])
        written[name] = tmp_path / f"{name}.ckpt"
        run.save_checkpoint(written[name])
    main(["combine", *(f"{n}={p}" for n, p in written.items()), "--output", str(tmp_path / "joint.ckpt")])
    assert "tasks seg, depth on one encoder" in capsys.readouterr().out
    joint = load_task(tmp_path / "joint.ckpt")
    assert isinstance(joint, MultiTask)
    images = torch.randn(2, 3, 32, 32)
    outputs = joint(images)
    for name, path in written.items():
        torch.testing.assert_close(outputs[name], load_task(path)(images), rtol=0, atol=0)

    # used as a model: every task's result from one encoder pass, each its single checkpoint's
    predictor = vitdense.load(tmp_path / "joint.ckpt")
    image = np.random.default_rng(0).integers(0, 256, (32, 40, 3), dtype=np.uint8)
    results = predictor(image)
    for name, path in written.items():
        assert results[name].to_dict() == vitdense.load(path)(image).to_dict(), name
    # (Segmenter slides 32 x 32 windows over a 32 x 40 image, DPT reads it whole: two passes)
    assert list(results) == ["seg", "depth"] and predictor.last_passes == 2
    assert predictor(image[:, :32]) and predictor.last_passes == 1  # one window: one batch for both
    with pytest.raises(ConfigError, match="slicing: SegmentationTask predicts SegmentationResult, not objects"):
        vitdense.load(tmp_path / "joint.ckpt", slicing=Slicing(slice_height=16, slice_width=16))
    alike = MultiTaskPredictor.from_checkpoint(tmp_path / "joint.ckpt", preprocess_as="seg")
    assert alike.predictors["depth"].data.preprocess == alike.predictors["seg"].data.preprocess
    assert list(alike(image[:, :32], tasks=["depth", "seg"])) == ["depth", "seg"] and alike.last_passes == 1

    # the server's API: every task, or those a request names; a bad name is that request's 400
    api = PredictorAPI(tmp_path / "joint.ckpt", max_batch_size=4)
    api.setup("cpu")
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    sent = {"image": base64.b64encode(buffer.getvalue()).decode()}
    asked = [api.decode_request(sent), api.decode_request({**sent, "tasks": ["depth"]})]
    asked.append(api.decode_request({**sent, "tasks": "seg, nope"}))
    answers = [api.encode_response(answer) for answer in api.predict(asked)]
    batched = predictor([image, image])  # (the server's batch: its two good requests)
    assert answers[:2] == [{n: r.to_dict() for n, r in batched[0].items()}, {"depth": batched[1]["depth"].to_dict()}]
    assert answers[2].status_code == 400 and b"names ['nope']" in answers[2].body

    # one graph, every task's outputs by name, the encoder once: = eager at another size and batch
    path, _, names = export_checkpoint(tmp_path / "joint.ckpt", "pt2", tmp_path / "joint.pt2", 48, 48)
    assert names == ["seg.logits", "depth.depth"]
    pixels = torch.rand(3, 3, 64, 80) * 255
    model = load_model(tmp_path / "joint.ckpt")
    with torch.no_grad(), model.backbone.one_pass() as shared:
        eager = exportable(model, *normalization_of(Checkpoint(tmp_path / "joint.ckpt")))(pixels)
    assert shared.encoded == 1
    for got, want in zip(run_exported(path, "pt2", pixels), eager, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)

    moved = tasks()["depth"]  # trained encoder: other weights
    torch.nn.init.normal_(moved.backbone.blocks[0].mlp.fc1.weight)
    run = trainer(tmp_path / "moved", max_steps=1, limit_val_batches=0)
    run.fit(moved, datamodule=data(tmp_path)["depth"])
    run.save_checkpoint(tmp_path / "moved.ckpt")
    with pytest.raises(SystemExit):
        main(["combine", f"seg={written['seg']}", f"depth={tmp_path / 'moved.ckpt'}", "-o", str(tmp_path / "x.ckpt")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(
        f"vitdense: error: combine: the encoder of depth ({tmp_path / 'moved.ckpt'}) differs from seg's"
    )


def test_a_run_stopped_mid_epoch_resumes_as_if_never_stopped(tmp_path):
    """Joint training resumed from a checkpoint written inside an epoch (2 steps an epoch: the
    seg loader's 2 batches, the depth loader's 1 cycling), as a killed run resumes from its
    last.ckpt, ends with the weights of the same run never stopped, to the bit."""

    class SaveAtStep3(L.Callback):  # (where ModelCheckpoint saves: after the step)
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 3:
                trainer.save_checkpoint(tmp_path / "stopped.ckpt")

    def run(ckpt=None) -> MultiTask:
        L.seed_everything(0)
        model = MultiTask(tasks())
        fit = trainer(tmp_path / ("resumed" if ckpt else "never_stopped"), max_steps=4, limit_val_batches=0)
        fit.callbacks.append(SaveAtStep3())
        fit.fit(model, datamodule=MultiTaskDataModule(data(tmp_path)), ckpt_path=ckpt)
        return model

    never_stopped = run()
    resumed = run(tmp_path / "stopped.ckpt")
    for (key, a), b in zip(never_stopped.state_dict().items(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=key)


def test_co_annotated_scenes_label_the_same_pixels_alike():
    """Each object's box is the extent of its segment, in the rendered scene and after the one
    crop and flip every task's labels share; every task's sample holds the same image."""
    scene = labeled_scene(48, 64, np.random.default_rng(5))
    assert len(scene["boxes"]) and set(np.unique(scene["segments"])) <= {0, 1, 2, 3}
    assert (scene["depth"] > 0).all()
    for (x1, y1, x2, y2), label in zip(scene["boxes"].astype(int), scene["labels"], strict=True):
        inside = scene["segments"][y1:y2, x1:x2] == 2 + label
        assert inside[0].any() and inside[-1].any() and inside[:, 0].any() and inside[:, -1].any()
    data = SyntheticScenesDataModule(img_size=32, train_size=8, val_size=2, loader=LoaderConfig(batch_size=2))
    data.setup("fit")
    for index in range(8):
        sample = data.train_set[index]
        assert sample["det"].image is sample["seg"].image is sample["depth"].image
        height, width = sample["seg"].mask.shape
        boxes = sample["det"].eval_targets.boxes.round().int()
        for (x1, y1, x2, y2), label in zip(boxes.tolist(), sample["det"].targets.labels.tolist(), strict=True):
            assert 0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height
            assert (sample["seg"].mask[y1:y2, x1:x2] == 2 + label).any()
        assert sample["depth"].depth.shape == (height, width) and (sample["depth"].depth > 0).all()


def test_two_tasks_with_one_name_are_one_line(tmp_path, capsys):
    """YAML keeps the last of two equal keys silently: the command line refuses the file."""
    config = tmp_path / "twice.yaml"
    config.write_text(
        "model:\n  class_path: vitdense.tasks.MultiTask\n  init_args:\n    tasks:\n"
        "      seg: {class_path: vitdense.tasks.SegmentationTask}\n"
        "      seg: {class_path: vitdense.tasks.DepthTask}\n"
    )
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(config)])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"vitdense: error: {config}: not valid YAML (the key 'seg' is given twice in one mapping at line 6, column 7)"
    )
