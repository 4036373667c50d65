"""`python -m vitdense.viz`: every command on a randomly initialised tiny model, on a
timm-format weight file and on vitdense checkpoints, offline; the figures' numbers are the
analyses' own."""

import csv
import subprocess
import sys

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import save_file

from vitdense.viz import analysis
from vitdense.viz.commands import main
from vitdense.viz.load import load_model, prepare

TINY = ["--model", "vit_tiny_patch16_224", "--model-args", '{"depth": 2}', "--img-size", "64"]
BACKBONE_COMMANDS = {
    "attention": ["--head", "all"],
    "rollout": [],
    "attention-distance": ["--num-images", "2"],
    "pos-embed": ["--grid", "6x5"],
    "filters": ["--components", "8"],
}


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    for name, (h, w) in {"wide.jpg": (40, 70), "square.png": (48, 48), "tall.png": (60, 30)}.items():
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / name)
    return root


@pytest.fixture(scope="module")
def timm_file(tmp_path_factory):
    """A timm ViT-Ti/16 (2 blocks) state dict, as `timm.create_model(...).state_dict()` saves it."""
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=2, img_size=64)
    path = tmp_path_factory.mktemp("weights") / "vit_tiny_2.safetensors"
    save_file(model.state_dict(), path)
    return path


def run(command, *args, out, images=None):
    argv = [command, *args, "--out", str(out), "--save-data"]
    return main(argv + (["--images", str(images)] if images is not None else []))


@pytest.mark.parametrize("command", BACKBONE_COMMANDS)
@pytest.mark.parametrize("source", ["random", "timm file"])
def test_every_backbone_command_writes_its_figure_and_numbers(command, source, photos, timm_file, tmp_path):
    model_args = TINY if source == "random" else ["--weights", str(timm_file), *TINY]
    images = photos if command in ("attention", "rollout", "attention-distance") else None
    written = run(command, *model_args, *BACKBONE_COMMANDS[command], out=tmp_path, images=images)
    pngs = [p for p in written if p.suffix == ".png"]
    data = [p for p in written if p.suffix in (".npy", ".csv")]
    assert pngs and data and all(p.is_file() and p.parent == tmp_path / command for p in written)
    assert len(pngs) == (3 if command in ("attention", "rollout") else 1)  # one per image, or one in all
    assert Image.open(pngs[0]).size[0] > 100


def test_a_timm_file_is_loaded_not_ignored(timm_file):
    """The weights in the figures are the file's: the position embeddings equal timm's."""
    reference = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=2, img_size=64)
    from safetensors.torch import load_file

    reference.load_state_dict(load_file(timm_file))
    model = load_model(None, str(timm_file), "vit_tiny_patch16_224", {"depth": 2}, 64)
    assert torch.equal(model.backbone.pos_embed, reference.pos_embed)
    assert torch.equal(model.backbone.patch_embed.proj.weight, reference.patch_embed.proj.weight)


def test_saved_numbers_are_the_analyses_of_the_model(photos, timm_file, tmp_path):
    model = load_model(None, str(timm_file), "vit_tiny_patch16_224", {"depth": 2}, 64)
    image = np.asarray(Image.open(photos / "square.png").convert("RGB"))
    with torch.no_grad():
        features = model.backbone(prepare(image, model), attentions=[0, 1])
    args = ["--weights", str(timm_file), *TINY]

    run("rollout", *args, out=tmp_path, images=photos / "square.png")
    rolled = analysis.attention_rollout(features.attentions)[0, 0, 1:].reshape(1, 4, 4)
    np.testing.assert_allclose(np.load(tmp_path / "rollout" / "square.npy"), rolled.numpy(), rtol=1e-5)

    run("attention", *args, "--layer", "0", "--head", "1", out=tmp_path, images=photos / "square.png")
    head = features.attentions[0][0, 1, 0, 1:].reshape(1, 4, 4)
    np.testing.assert_allclose(np.load(tmp_path / "attention" / "square.npy"), head.numpy(), rtol=1e-5)

    run("attention-distance", *args, "--num-images", "1", out=tmp_path, images=photos / "square.png")
    rows = list(csv.DictReader((tmp_path / "attention-distance" / "distance.csv").open()))
    assert [(r["layer"], r["head"]) for r in rows] == [(str(layer), str(h)) for layer in (1, 2) for h in (1, 2, 3)]
    second_layer = analysis.mean_attention_distance(features.attentions[1], 1, (4, 4), (16, 16))
    assert [float(r["mean_distance_px"]) for r in rows[3:]] == pytest.approx(second_layer.tolist(), abs=1e-3)


def test_decoder_attention_on_a_detection_checkpoint(trained, photos, tmp_path):
    _, ckpt = trained["det"]
    # 5 panels in rows of 4: the second row is part empty
    written = run("decoder-attention", "--ckpt_path", str(ckpt), "--top", "4", out=tmp_path, images=photos)
    maps = np.load(tmp_path / "decoder-attention" / "wide.npy")
    model = load_model(str(ckpt))
    grid = model.backbone.patch_embed.grid_for(model.img_size, model.img_size)
    assert maps.shape == (4, *grid)
    np.testing.assert_allclose(maps.reshape(4, -1).sum(1), 1, rtol=1e-5)  # each query's attention is a distribution
    assert sum(p.suffix == ".png" for p in written) == 3


def test_class_masks_on_a_segmentation_checkpoint(trained, photos, tmp_path):
    _, ckpt = trained["seg"]
    written = run("class-masks", "--ckpt_path", str(ckpt), out=tmp_path, images=photos)
    probs = np.load(tmp_path / "class-masks" / "tall.npy")
    model = load_model(str(ckpt))
    assert probs.shape[0] == model.task.num_classes
    np.testing.assert_allclose(probs.sum(0), 1, rtol=1e-5)
    assert sum(p.suffix == ".png" for p in written) == 3


def test_backbone_commands_take_a_task_checkpoint_too(trained, tmp_path):
    _, ckpt = trained["cls"]
    assert run("pos-embed", "--ckpt_path", str(ckpt), out=tmp_path)


def test_a_checkpoint_saved_from_python(fitted_from_python, photos, tmp_path):
    """A task fitted with `lightning.Trainer(...).fit(task, datamodule)`, no CLI: its checkpoint
    loads as its task, with its data's normalisation."""
    task, ckpt = fitted_from_python
    written = run("rollout", "--ckpt_path", str(ckpt), out=tmp_path, images=photos)
    assert sum(p.suffix == ".png" for p in written) == 3
    model = load_model(str(ckpt))
    assert type(model.task) is type(task) and model.img_size == 32
    assert model.mean == (0.485, 0.456, 0.406)  # what its DataModule used (no encoder named), not the encoder's 0.5


def test_an_older_python_checkpoint(older_python_checkpoint, capsys, tmp_path):
    """Saved from Python before checkpoints named their classes: the error says how to load it,
    and its encoder alone is shown as --weights with --model."""
    with pytest.raises(SystemExit):
        main(["pos-embed", "--ckpt_path", str(older_python_checkpoint), "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert "TheTask.load_from_checkpoint(" in err and "--weights <this file> --model" in err
    tiny = ["--model", "vit_tiny_patch16_224", "--model-args", '{"depth": 1}', "--img-size", "32"]
    assert run("pos-embed", "--weights", str(older_python_checkpoint), *tiny, out=tmp_path)


@pytest.mark.parametrize(
    "args,message",
    [
        (["decoder-attention", "--images", "x.png"], "decoder-attention needs a detection checkpoint"),
        (["filters", "--model", "vit_tiny_r_s16_p8_224"], "a hybrid embeds ResNet features"),
        (["filters"], "give --ckpt_path"),
    ],
)
def test_clear_errors(args, message, trained, capsys):
    argv = [*args, "--ckpt_path", str(trained["cls"][1])] if args[0] == "decoder-attention" else args
    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


def test_a_weight_file_needs_its_architecture(timm_file, capsys):
    with pytest.raises(SystemExit):
        main(["filters", "--weights", str(timm_file)])
    assert "add --model <timm name of its architecture>" in capsys.readouterr().err


def test_python_dash_m_entry_point(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "vitdense.viz", "filters", *TINY, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert f"wrote {tmp_path / 'filters' / 'filters.png'}" in out.stdout


def test_the_old_checkpoint_option_still_works_and_warns(trained, timm_file, tmp_path):
    """`--checkpoint` took either kind of file; it still does, naming the option that replaces it."""
    _, ckpt = trained["cls"]
    with pytest.warns(FutureWarning, match=f"--checkpoint is deprecated: use --ckpt_path {ckpt}"):
        assert run("pos-embed", "--checkpoint", str(ckpt), out=tmp_path)
    with pytest.warns(FutureWarning, match=f"--checkpoint is deprecated: use --weights {timm_file}"):
        assert run("pos-embed", "--checkpoint", str(timm_file), *TINY, out=tmp_path)


def test_ckpt_path_and_weights_are_one_or_the_other(trained, timm_file, capsys):
    with pytest.raises(SystemExit):
        main(["pos-embed", "--ckpt_path", str(trained["cls"][1]), "--weights", str(timm_file), *TINY])
    assert (
        "give --ckpt_path (a vitdense .ckpt) or --weights (a backbone weight file), not both" in capsys.readouterr().err
    )
