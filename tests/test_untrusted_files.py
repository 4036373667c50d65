"""Files that run code as they unpickle: refused by every entry point that takes a file,
with one line naming the opt-in; official checkpoints (an `args` Namespace, numpy scalars
beside the weights) load without it; a trusted file loads with it."""

import argparse
import pickle
from pathlib import Path

import numpy as np
import pytest
import timm
import torch

import vitdense
from tests.test_checkpoints import run_error
from vitdense.backbone import create_backbone, read_state_dict
from vitdense.backbone.config import BackboneConfig
from vitdense.cli import main as cli
from vitdense.core.errors import CheckpointError
from vitdense.core.safe_load import OFFICIAL_GLOBALS, official_globals
from vitdense.deploy.checkpoint import Checkpoint, load_model, load_task
from vitdense.viz.commands import main as viz

DEMO = str(Path(__file__).parents[1] / "configs" / "demo_cls.yaml")
SMALL = ["--data.init_args.train_size=8", "--data.init_args.val_size=4", "--trainer.max_steps=1"]
SMALL += ["--model.init_args.backbone.model_args={depth: 1}"]
TINY = {"depth": 1}
TINY_VIZ = ["--model", "vit_tiny_patch16_224", "--model-args", '{"depth": 1}', "--img-size", "32"]


class MakesMarker:
    """Unpickled, it creates a file: the least a hostile file could do (no shell involved)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


class Note:
    """A harmless custom object that a trusted file carries beside its weights."""

    def __init__(self, text: str) -> None:
        self.text = text


def tiny_timm_state() -> dict[str, torch.Tensor]:
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, **TINY).state_dict()


@pytest.fixture(scope="module")
def evil(tmp_path_factory):
    """{suffix: a file holding real weights and an object whose unpickling creates `marker`}, marker."""
    folder = tmp_path_factory.mktemp("evil")
    marker = folder / "marker"
    weights = tiny_timm_state()
    files = {}
    for suffix in (".pth", ".bin", ".ckpt"):
        files[suffix] = folder / f"evil{suffix}"
        torch.save({"model": weights, "extra": MakesMarker(marker)}, files[suffix])
    return files, marker


@pytest.fixture(autouse=True)
def _no_marker(request):
    """Each test starts without the marker (one entry point that ran it must not fail the others)."""
    if "evil" in request.fixturenames:
        request.getfixturevalue("evil")[1].unlink(missing_ok=True)


def test_the_file_does_run_code_when_loaded_in_full(evil):
    """What the refusals below prevent: the marker appears as soon as the file is unpickled."""
    files, marker = evil
    read_state_dict(files[".pth"], trust=True)
    assert marker.exists()


BACKBONE_ENTRIES = {
    "read_state_dict": lambda path: read_state_dict(path),
    "create_backbone": lambda path: create_backbone("vit_tiny_patch16_224", checkpoint=path, model_args=TINY),
    "BackboneConfig.build": lambda path: BackboneConfig(checkpoint=str(path), model_args=TINY).build(),
}


@pytest.mark.parametrize("suffix", [".pth", ".bin", ".ckpt"])
@pytest.mark.parametrize("entry", BACKBONE_ENTRIES)
def test_python_backbone_entries_refuse(entry, suffix, evil):
    files, marker = evil
    with pytest.raises(CheckpointError) as err:
        BACKBONE_ENTRIES[entry](files[suffix])
    message = str(err.value)
    assert "\n" not in message and f"{files[suffix]}: holds Python objects" in message
    assert "GLOBAL io.open" in message
    assert "model.init_args.backbone.trust_checkpoint=true" in message and "--trust_checkpoint" in message
    assert not marker.exists()


@pytest.mark.parametrize("suffix", [".pth", ".bin", ".ckpt"])
def test_fit_refuses_a_backbone_checkpoint(suffix, evil, capsys, tmp_path, monkeypatch):
    """The backbone loads as the task is built: `fit` stops there, before any step."""
    files, marker = evil
    monkeypatch.chdir(tmp_path)
    args = ["fit", "--config", DEMO, *SMALL, f"--model.init_args.backbone.checkpoint={files[suffix]}"]
    line = run_error(args, capsys, cli)
    assert line.startswith(f"vitdense: error: checkpoint {files[suffix]}: holds Python objects beyond torch's")
    assert "set model.init_args.backbone.trust_checkpoint=true" in line
    assert not marker.exists()


@pytest.mark.parametrize(
    "command",
    [
        ["fit", "--config", DEMO, *SMALL],  # resumes from it
        ["validate"],
        ["test"],
        ["predict"],
        ["export", "--format", "onnx"],
        ["export", "--format", "weights"],
        ["serve", "--port", "0"],
    ],
    ids=["fit", "validate", "test", "predict", "export-onnx", "export-weights", "serve"],
)
def test_commands_refuse_a_ckpt_path(command, evil, capsys, tmp_path, monkeypatch):
    files, marker = evil
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("litserve.LitServer.run", lambda *a, **k: pytest.fail("started a server"))
    line = run_error([*command, f"--ckpt_path={files['.ckpt']}"], capsys, cli)
    assert line.startswith(f"vitdense: error: ckpt_path {files['.ckpt']}: holds Python objects beyond torch's")
    assert "GLOBAL io.open" in line and "pass a .ckpt written by vitdense training" in line
    assert not marker.exists()


CKPT_ENTRIES = {
    "vitdense.load": vitdense.load,
    "vitdense.load_model": vitdense.load_model,
    "load_task": load_task,
    "load_model": load_model,
    "Checkpoint": Checkpoint,
}


@pytest.mark.parametrize("entry", CKPT_ENTRIES)
def test_python_checkpoint_entries_refuse(entry, evil):
    files, marker = evil
    with pytest.raises(CheckpointError, match=r"holds Python objects beyond torch's weights_only allow-list"):
        CKPT_ENTRIES[entry](files[".ckpt"])
    assert not marker.exists()


@pytest.mark.parametrize(
    "args,suffix",
    [
        (["--ckpt_path"], ".ckpt"),
        (["--weights"], ".pth"),
        (["--weights"], ".bin"),
        (["--weights"], ".ckpt"),
        (["--checkpoint"], ".bin"),  # the example, under the deprecated name
        (["--checkpoint"], ".pth"),
        (["--checkpoint"], ".ckpt"),
    ],
)
def test_viz_refuses(args, suffix, evil, capsys, tmp_path):
    files, marker = evil
    argv = ["pos-embed", *args, str(files[suffix]), "--out", str(tmp_path)]
    line = run_error(argv + (TINY_VIZ if args != ["--ckpt_path"] else []), capsys, viz)
    assert "holds Python objects beyond torch's weights_only allow-list (GLOBAL io.open)" in line
    assert not marker.exists()


def test_a_trusted_file_loads_with_the_opt_in(tmp_path, capsys, caplog):
    """A file the user trusts, holding a custom object beside the weights: refused without the
    opt-in, loaded with it (`BackboneConfig.trust_checkpoint`, viz's `--trust_checkpoint`)."""
    weights = tiny_timm_state()
    path = tmp_path / "trusted.pth"
    torch.save({"model": weights, "note": Note("fine-tuned on my photos")}, path)
    with pytest.raises(CheckpointError, match=r"GLOBAL tests.test_untrusted_files.Note"):
        BackboneConfig(checkpoint=str(path), model_args=TINY).build()
    with caplog.at_level("WARNING"):
        backbone = BackboneConfig(checkpoint=str(path), model_args=TINY, trust_checkpoint=True).build()
    assert "trusted, so loaded with weights_only=False" in caplog.text
    assert all(torch.equal(v, weights[k]) for k, v in backbone.state_dict().items())
    assert read_state_dict(path, trust=True)["note"].text == "fine-tuned on my photos"
    assert viz(["pos-embed", "--weights", str(path), "--trust_checkpoint", *TINY_VIZ, "--out", str(tmp_path)])


def test_fit_takes_the_opt_in_from_yaml(tmp_path, monkeypatch):
    """`model.init_args.backbone.trust_checkpoint` reaches the task built by the CLI."""
    monkeypatch.chdir(tmp_path)
    weights = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=64, **TINY)
    weights = weights.state_dict()
    path = tmp_path / "trusted.bin"
    torch.save({"model": weights, "note": Note("mine")}, path)
    monkeypatch.setattr("vitdense.trainer.Trainer.fit", lambda *a, **k: None)  # the build is what is checked
    run = cli(
        ["fit", "--config", DEMO, *SMALL]
        + [f"--model.init_args.backbone.checkpoint={path}", "--model.init_args.backbone.trust_checkpoint=true"]
    )
    assert run.model.backbone_config.trust_checkpoint
    assert torch.equal(run.model.backbone.pos_embed, weights["pos_embed"])


def official_files(folder: Path) -> dict[str, tuple[Path, dict[str, torch.Tensor]]]:
    """A DeiT- and an MAE-style training checkpoint of a random tiny ViT: {name: (file, the weights)}."""
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, **TINY)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    for p in model.parameters():  # an optimizer state as after a step, without the forward pass
        p.grad = torch.randn_like(p)
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=300)
    scaler = torch.amp.GradScaler("cpu").state_dict()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    deit_args = argparse.Namespace(model="deit_tiny_patch16_224", lr=5e-4, epochs=300, input_size=224, smoothing=0.1)
    mae_args = argparse.Namespace(model="mae_vit_base_patch16", mask_ratio=0.75, norm_pix_loss=True, blr=1.5e-4)
    deit = {
        "model": weights,
        "optimizer": optimizer.state_dict(),
        "lr_scheduler": scheduler.state_dict(),
        "epoch": 299,
        "model_ema": weights,
        "args": deit_args,
        "scaler": scaler,
        "max_accuracy": np.float64(72.2),  # numpy scalars, as metrics often end up
    }
    mae = {"model": weights, "optimizer": optimizer.state_dict(), "epoch": np.int64(799), "scaler": scaler}
    mae["args"] = mae_args
    files = {}
    for name, content in (("deit", deit), ("mae", mae)):
        files[name] = folder / f"{name}.pth", weights
        torch.save(content, files[name][0])
    return files


def test_official_checkpoints_load_without_the_opt_in(tmp_path):
    for name, (path, weights) in official_files(tmp_path).items():
        unsafe = set(torch.serialization.get_unsafe_globals_in_checkpoint(path))
        assert "argparse.Namespace" in unsafe and "numpy._core.multiarray.scalar" in unsafe, name
        backbone = BackboneConfig(checkpoint=str(path), model_args=TINY).build()
        got = backbone.state_dict()
        assert all(torch.equal(got[k], weights[k]) for k in got), name
        assert isinstance(read_state_dict(path)["args"], argparse.Namespace)


def test_numpy_1_scalars_load(tmp_path):
    """Official checkpoints were pickled under numpy 1, which names the scalar `numpy.core...`."""
    path = tmp_path / "old.pth"
    torch.save({"best": np.float64(0.5)}, path, _use_new_zipfile_serialization=False, pickle_protocol=2)
    old = path.read_bytes().replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    assert b"numpy.core.multiarray\nscalar" in old
    path.write_bytes(old)
    assert read_state_dict(path)["best"] == 0.5


def test_the_allow_list_is_ours_alone(tmp_path):
    """Our loads widen torch's allow-list only while they run, and leave a user's own entries."""
    before = set(torch.serialization.get_safe_globals())
    with official_globals():
        assert set(OFFICIAL_GLOBALS) <= set(torch.serialization.get_safe_globals())
    assert set(torch.serialization.get_safe_globals()) == before
    with torch.serialization.safe_globals([argparse.Namespace]):  # the user's own
        with official_globals():
            pass
        assert argparse.Namespace in torch.serialization.get_safe_globals()
    path = tmp_path / "namespace.pth"
    torch.save(argparse.Namespace(a=1), path)
    with pytest.raises(pickle.UnpicklingError):  # outside our loads torch refuses as before
        torch.load(path, weights_only=True)


def test_a_checkpoint_does_not_unpickle_the_weights_file_it_names(tmp_path, monkeypatch, capsys):
    """A checkpoint that recorded `backbone.checkpoint` with `trust_checkpoint: true`, shipped
    beside a hostile file at that path: restoring it (Python, predict, validate) never reads
    the file, whose weights the checkpoint's replace anyway."""
    monkeypatch.chdir(tmp_path)
    weights = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=64, **TINY)
    torch.save({"model": weights.state_dict(), "note": Note("mine")}, tmp_path / "start.pth")
    args = ["fit", "--config", DEMO, *SMALL, "--data.init_args.loader.batch_size=4", "--trainer.logger=false"]
    args += ["--model.init_args.backbone.checkpoint=start.pth", "--model.init_args.backbone.trust_checkpoint=true"]
    cli([*args, "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}"])
    (ckpt,) = (tmp_path / "runs").rglob("last.ckpt")
    marker = tmp_path / "marker"
    torch.save({"model": weights.state_dict(), "extra": MakesMarker(marker)}, tmp_path / "start.pth")
    expected = load_model(ckpt).backbone.pos_embed
    assert torch.equal(load_task(ckpt).backbone.pos_embed, expected)
    vitdense.load(ckpt)(np.zeros((20, 30, 3), np.uint8))
    for command in ("validate", "predict"):
        cli([command, f"--ckpt_path={ckpt}", "--trainer.logger=false", "--trainer.enable_progress_bar=false"])
    assert not marker.exists()
