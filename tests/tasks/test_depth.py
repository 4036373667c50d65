"""DepthTask with DPT: fit -> predict (16-bit PNGs) -> load -> serve -> export through the
task contract, evaluation unpadded per size, relative depth aligned as MiDaS, config errors."""

import base64
import csv
import io
import json
from functools import partial

import numpy as np
import pytest
import torch
from PIL import Image

import vitdense
from vitdense.cli import main
from vitdense.core.errors import ConfigError
from vitdense.heads import DPTHead
from vitdense.heads.dpt import dpt_hooks
from vitdense.losses import ScaleShiftInvariantLoss, compute_scale_and_shift
from vitdense.models.depth import DPT
from vitdense.results.depth import DepthResult
from vitdense.tasks import BackboneConfig, DepthTask
from vitdense.tasks.depth import align_inverse_depth
from vitdense.types.collate import pad_collate
from vitdense.types.depth import DepthImages

TINY = BackboneConfig(name="vit_tiny_patch16_224", img_size=32, model_args={"depth": 4})
HEAD = partial(DPTHead, features=16, out_channels=(8, 8, 16, 16))


def task(**kwargs) -> DepthTask:
    torch.manual_seed(0)
    return DepthTask(**{"head": HEAD, "backbone": TINY, **kwargs})


#: the demo's task, tiny (config's `model`)
MODEL = {
    "class_path": "vitdense.tasks.DepthTask",
    "init_args": {
        "head": {"class_path": "vitdense.heads.DPTHead", "init_args": {"features": 16, "out_channels": [8, 8, 16, 16]}},
        "backbone": {"name": "vit_tiny_patch16_224", "model_args": {"depth": 4}},
    },
}


@pytest.fixture(scope="module")
def fitted(tiny_runs):
    """The demo's task, tiny (`MODEL`), fitted for two steps through the CLI on the synthetic
    rooms, its config in root/depth.yaml (the session's run: tests/tiny_runs.py): (root, checkpoint)."""
    return tiny_runs["depth"]


@pytest.fixture(scope="module")
def small():
    return task().eval()


def test_hooks_follow_dpt_per_depth_unless_given(small):
    assert dpt_hooks(12) == (2, 5, 8, 11) and dpt_hooks(24) == (5, 11, 17, 23)  # DPT's ViT-B and ViT-L
    assert small.head.hooks == (0, 1, 2, 3)  # the same rule for the 4-block backbone
    assert task(head=partial(HEAD, hooks=(0, 0, 1, 3))).head.hooks == (0, 0, 1, 3)
    with pytest.raises(ConfigError, match="out of range"):
        task(head=partial(HEAD, hooks=(0, 1, 2, 9)))


def test_config_errors(small):
    with pytest.raises(ConfigError, match="set output: inverse"):
        task(loss=ScaleShiftInvariantLoss)
    with pytest.raises(ConfigError, match="min_depth < max_depth"):
        task(min_depth=5.0, max_depth=1.0)
    t = small
    sizes = [(32, 48), (32, 32)]
    batch = pad_collate([DepthImages.of(torch.randn(3, *s), torch.ones(*s), i) for i, s in enumerate(sizes)])
    with pytest.raises(ConfigError, match="one size"):
        t.forward_batch(batch, "train")


def test_evaluation_gives_each_image_what_it_gives_alone(small):
    """DPT is not padding-invariant: `estimate` runs each size unpadded, so a padded batch
    equals each image alone, resized to its depth map's size."""
    t = small
    g = torch.Generator().manual_seed(0)
    images = [
        torch.randn(3, 32, 48, generator=g),
        torch.randn(3, 48, 32, generator=g),
        torch.randn(3, 32, 48, generator=g),
    ]
    depth_sizes = [(40, 60), (48, 32), (32, 48)]
    samples = zip(images, depth_sizes, strict=True)
    batch = pad_collate([DepthImages.of(x, torch.ones(*s), i) for i, (x, s) in enumerate(samples)])
    together = t.model.estimate(batch.image, batch.image_sizes, batch.depth_sizes.sizes)
    for image, size, got in zip(images, depth_sizes, together, strict=True):
        with torch.no_grad():
            alone = torch.nn.functional.interpolate(t.model(image[None]), size=size, mode="bilinear")[0, 0]
        assert got.shape == size
        torch.testing.assert_close(got, alone, atol=1e-5, rtol=1e-5)


def test_model_output_at_input_pixels_for_any_size(small):
    t = small
    with torch.no_grad():
        assert t.model(torch.randn(2, 3, 40, 56)).shape == (2, 1, 40, 56)  # grid 3 x 4, cropped back
        assert (t.model(torch.randn(1, 3, 32, 32)) >= 0).all()  # DPT's non-negative ReLU


def test_an_untrained_head_starts_alive_at_init_depth():
    """PyTorch's initialisation leaves DPT's final ReLU at 0 on every pixel for about half
    the seeds (no gradient: the head never learns); the task starts it at init_depth."""
    x = torch.randn(2, 3, 32, 48, generator=torch.Generator().manual_seed(0))
    cases = [
        (0, {"output": "inverse", "inverse_shift": 0.1}, 5.0),  # default: max_depth / 2
        (1, {"output": "inverse", "inverse_shift": 0.1}, 5.0),
        (2, {"output": "inverse", "inverse_scale": 0.000305, "inverse_shift": 0.1378, "init_depth": 2.0}, 2.0),
        (3, {"output": "metric", "max_depth": 80.0}, 40.0),  # seed 3: PyTorch's start is 0 on every pixel
    ]
    for seed, kwargs, expected in cases:
        torch.manual_seed(seed)
        t = DepthTask(head=HEAD, backbone=TINY, **kwargs).eval()
        with torch.no_grad():
            raw = t.model(x)
        assert (raw > 0).all(), seed
        assert expected / 2 < t.model.depth(raw).median() < expected * 2, seed
    with pytest.raises(ConfigError, match="nearer init_depth"):
        task(output="inverse", inverse_shift=0.1, init_depth=12.0)


def test_inverse_output_is_dpts_invert(small):
    model = DPT(small.backbone, small.head, "inverse", 0.000305, 0.1378)  # DPT's NYU model
    raw = torch.tensor([[0.0, 1000.0, 3000.0]])
    torch.testing.assert_close(model.depth(raw), 1 / (0.000305 * raw + 0.1378))
    assert DPT(small.backbone, small.head, "inverse").depth(torch.tensor([-1.0]))[0] == pytest.approx(
        1e8
    )  # DPT's floor
    with pytest.raises(ConfigError, match="output='inverse'"):
        DPT(small.backbone, small.head, "metric", relative=True)


def test_relative_depth_is_aligned_in_inverse_depth_before_the_metrics():
    """MiDaS's / DPT's evaluation of affine-invariant models: a prediction that is an affine
    map of the true inverse depth evaluates as perfect."""
    g = torch.Generator().manual_seed(0)
    depth = torch.rand(24, 32, generator=g) * 8 + 1
    depth[:3] = 0  # no measurement
    valid = depth > 0
    raw = 3.0 * torch.where(valid, 1 / depth.clamp(min=1e-3), torch.zeros_like(depth)) - 0.05
    aligned = align_inverse_depth(raw, depth, valid)
    torch.testing.assert_close(aligned[valid], depth[valid], rtol=1e-4, atol=1e-4)
    assert DPT(*(torch.nn.Identity(),) * 2, "inverse", relative=True).export_names == ("inverse_depth",)
    s, sh = compute_scale_and_shift(
        (raw * valid)[None], torch.where(valid, 1 / depth.clamp(min=1e-3), 0)[None], valid[None]
    )
    assert float(s) == pytest.approx(1 / 3, rel=1e-4) and float(sh) == pytest.approx(0.05 / 3, rel=1e-3)


def test_fit_logs_the_depth_metrics(fitted):
    root, ckpt = fitted
    state = torch.load(ckpt, weights_only=True)
    assert state["hyper_parameters"]["loss"]["class_path"].endswith("SILogLoss")
    t = DepthTask.load_from_checkpoint(ckpt, weights_only=True)
    assert isinstance(t.loss, torch.nn.Module) and t.head.hooks == (0, 1, 2, 3)


def test_predict_writes_16_bit_millimetres_equal_to_load(fitted, tmp_path):
    root, ckpt = fitted
    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    for name, size in (("a.jpg", (30, 44)), ("b.png", (40, 24))):
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(photos / name)
    args = ["predict", f"--ckpt_path={ckpt}", f"--data.predict_dir={photos}", "--trainer.logger=false"]
    main([*args, f"--trainer.default_root_dir={tmp_path}", "--trainer.enable_progress_bar=false"])
    out = tmp_path / "predictions"
    rows = list(csv.DictReader((out / "depth.csv").open()))
    results = {r.source: r for r in vitdense.load(ckpt)(photos)}
    assert sorted(r["path"] for r in rows) == sorted(results)
    for row in rows:
        result = results[row["path"]]
        assert isinstance(result, DepthResult) and not result.relative
        with Image.open(out / "depth" / row["png"]) as png:
            assert png.mode.startswith("I") and png.size == result.size[::-1]
            stored = np.asarray(png).astype(np.int64)
        # millimetres, as NYU's files: within one unit of rounding of the predictor's metres
        np.testing.assert_allclose(stored / 1000, result.depth, atol=0.0006)
        assert (out / "depth" / row["png"].replace(".png", "_color.jpg")).is_file()


def write_kitti_frame(root, drive, frame, size=(24, 40)):
    """One frame of KITTI's layout (raw image, annotated depth / 256 m): its split line."""
    image = f"2011_09_26/{drive}/image_02/data/{frame}.png"
    depth = f"{drive}/proj_depth/groundtruth/image_02/{frame}.png"
    rng = np.random.default_rng(len(drive) + int(frame))
    for path, pixels in (
        (root / "raw" / image, rng.integers(0, 256, (*size, 3), dtype=np.uint8)),
        (root / "data_depth_annotated" / depth, rng.integers(256, 80 * 256, size).astype(np.uint16)),
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(path)
    return f"{image} {depth} 721.5377"


def test_predict_on_a_split_names_each_file_after_its_image(fitted, tmp_path):
    """`predict` without `predict_dir` writes each image's depth under its own path in the split
    (KITTI's drives share frame names: no drive's file overwrites another's) and names the image
    in depth.csv."""
    root, ckpt = fitted
    kitti = tmp_path / "kitti"
    drives = ["2011_09_26_drive_0001_sync", "2011_09_26_drive_0002_sync"]
    lines = [write_kitti_frame(kitti, d, "0000000005") for d in drives]
    (kitti / "eigen_test_files_with_gt.txt").write_text("\n".join([*lines, "2011_09_26/x.png None 721.5"]) + "\n")
    data = {"class_path": "vitdense.data.KITTIDepthDataModule", "init_args": {"root": str(kitti), "img_size": 32}}
    (tmp_path / "kitti.yaml").write_text(json.dumps({"model": MODEL, "data": data}))
    args = ["predict", "--config", str(tmp_path / "kitti.yaml"), "--ckpt_path", str(ckpt), "--trainer.logger=false"]
    main([*args, f"--trainer.default_root_dir={tmp_path}", "--trainer.enable_progress_bar=false"])
    out = tmp_path / "predictions"
    rows = list(csv.DictReader((out / "depth.csv").open()))
    images = [f"2011_09_26/{d}/image_02/data/0000000005" for d in drives]
    assert [(r["path"], r["png"]) for r in rows] == [(f"{kitti / 'raw' / i}.png", f"{i}.png") for i in images]
    assert sorted(p.relative_to(out / "depth").as_posix() for p in out.rglob("*.png")) == [f"{i}.png" for i in images]


def test_load_draws_and_serves_the_depth(fitted):
    from vitdense.deploy.serve import PredictorAPI

    _, ckpt = fitted
    image = np.random.default_rng(1).integers(0, 256, (30, 44, 3), dtype=np.uint8)
    result = vitdense.load(ckpt)(image)
    assert result.depth.shape == (30, 44) and result.draw().shape == (30, 44, 3)
    assert result.draw(image).shape[0] == 30 and result.draw(image).shape[1] > 88  # image | depth
    answer = json.loads(json.dumps(result.to_dict()))
    assert answer["task"] == "depth" and answer["png_scale"] == 1000.0
    with Image.open(io.BytesIO(base64.b64decode(answer["depth_png"]))) as png:
        np.testing.assert_array_equal(np.asarray(png), result.stored())
    api = PredictorAPI(ckpt, max_batch_size=2)
    api.setup("cpu")
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    served = api.encode_response(
        api.predict([api.decode_request({"image": base64.b64encode(buffer.getvalue()).decode()})])[0]
    )
    assert served["depth_png"] == answer["depth_png"]


def test_onnx_equals_eager(fitted, tmp_path):
    """The graph (normalisation included) gives the eager model's metres, for a batch of two
    (the batch is dynamic), in onnxruntime and as OpenVINO IR. Exported at a fixed, non-square size: a DPT export with dynamic
    sizes costs 3x as much (12 s); dynamic sizes are tested in tests/test_export.py."""
    import onnxruntime

    from vitdense.deploy.export import export_checkpoint

    _, ckpt = fitted
    size = (32, 48)
    path, traced, outputs = export_checkpoint(ckpt, "onnx", tmp_path / "dpt.onnx", *size, dynamic=False)
    assert outputs == ["depth"] and traced.size == size and traced.batch_fixed_because is None
    model = vitdense.load_model(ckpt).eval()
    predictor = vitdense.load(ckpt)
    mean, std = torch.tensor(predictor.data.preprocess.mean), torch.tensor(predictor.data.preprocess.std)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    raw = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(0)) * 255  # the batch is dynamic
    (depth,) = session.run(None, {"images": raw.numpy()})
    with torch.no_grad():
        (expected,) = model.export_outputs((raw / 255 - mean[:, None, None]) / std[:, None, None])
    assert depth.shape == (2, 1, *size)
    torch.testing.assert_close(torch.from_numpy(depth), expected, atol=1e-4, rtol=1e-4)
    # OpenVINO IR, as `--format openvino` converts it from this ONNX file, in fp32
    from vitdense.deploy.runtimes import compile_openvino, onnx_to_openvino

    onnx_to_openvino(path, tmp_path / "dpt.xml")
    (depth,) = compile_openvino(tmp_path / "dpt.xml", "f32")(raw.numpy()).values()
    torch.testing.assert_close(torch.from_numpy(depth), expected, atol=1e-4, rtol=1e-4)


def test_dpt_hybrid_reads_the_resnet_stages():
    """DPT-Hybrid (R50+ViT): hooks (0, 1, blocks) by DPT's rule, the ResNet's stage channels
    checked against the head's out_channels; a plain ViT has no stages to read."""
    hybrid = BackboneConfig(
        name="vit_base_r50_s16_384", img_size=32, model_args={"depth": 4, "embed_dim": 32, "num_heads": 2}
    )
    head = partial(DPTHead, features=16, out_channels=(256, 512, 16, 16), stage_maps=2)
    torch.manual_seed(0)
    t = DepthTask(head=head, backbone=hybrid, output="inverse", inverse_shift=0.1).eval()
    assert t.head.hooks == (0, 1, 2, 3) and t.head.stage_hooks == (0, 1)  # DPT's (0, 1, 8, 11) for 12 blocks
    with torch.no_grad():
        raw = t.model(torch.randn(1, 3, 32, 48))
    assert raw.shape == (1, 1, 32, 48) and (raw > 0).float().mean() > 0.5  # alive (init_depth)
    with pytest.raises(ConfigError, match=r"stage 1 has 512 channels: set out_channels\[1\] to 512"):
        DepthTask(head=partial(head, out_channels=(256, 256, 16, 16)), backbone=hybrid)
    with pytest.raises(ConfigError, match="plain patch embedding"):
        DepthTask(head=head, backbone=TINY)


def test_evaluation_settings_given_at_test_win_over_the_checkpoints(fitted, tmp_path, capsys):
    """`test --config … --ckpt_path … --model.init_args.crop=garg` (or `max_depth=…`)
    evaluates with those (Lightning's CLI would put the checkpoint's over them), from the
    command line and from the YAML alike; a setting fixed at training is refused by name."""
    root, ckpt = fitted
    config = json.loads((root / "depth.yaml").read_text())
    run = [f"--ckpt_path={ckpt}", f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false"]
    run += ["--trainer.enable_progress_bar=false"]
    asked = ["--model.init_args.crop=garg", "--model.init_args.max_depth=0.5"]
    cli = main(["test", f"--config={root / 'depth.yaml'}", *run, *asked])
    assert (cli.model.crop, cli.model.max_depth) == ("garg", 0.5)
    metric = cli.model.test_metrics["test/depth"]
    assert (metric.crop, metric.max_depth) == ("garg", 0.5)  # the figures are computed with them

    config["model"]["init_args"].update(crop="garg", png_scale=256.0)  # the same, written in the YAML
    written = tmp_path / "eval.yaml"
    written.write_text(json.dumps(config))
    from_yaml = main(["test", f"--config={written}", *run])
    assert (from_yaml.model.crop, from_yaml.model.png_scale) == ("garg", 256.0)

    with pytest.raises(SystemExit) as exit_info:
        main(["test", f"--config={root / 'depth.yaml'}", *run, "--model.init_args.output=inverse"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "model.init_args.output='inverse'" in err and "was trained with 'metric'" in err and "crop" in err
