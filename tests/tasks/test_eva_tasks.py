"""Tasks on an encoder of timm's Eva family (here DINOv3: RoPE, registers, LayerScale, no
position table): fit -> predict -> export of a segmenter, and a training step of the demos
whose tasks treat the tokens in their own way (windows and several levels, a subset of the
tokens, corrupted tokens). EoMT's joined queries on DINOv3: configs/eomt_coco_panoptic_dinov3.yaml
in tests/test_configs.py. Classification and the linear probe read the class token and the
blocks' outputs as every encoder gives them."""

import numpy as np
import onnxruntime
import pytest
import torch

import vitdense
from tests.conftest import CONFIGS
from vitdense.cli import main
from vitdense.deploy.export import export_checkpoint

DINOV3 = [
    "--model.init_args.backbone.name=vit_small_patch16_dinov3",
    "--model.init_args.backbone.model_args={depth: 2, embed_dim: 64, num_heads: 2}",
]
QUICK = [
    "--trainer.max_steps=1",
    "--trainer.limit_val_batches=1",
    "--trainer.num_sanity_val_steps=0",
    "--trainer.enable_progress_bar=false",
    "--trainer.logger=false",
    "--data.init_args.train_size=4",
    "--data.init_args.val_size=2",
    "--data.init_args.loader.batch_size=2",
    "--data.init_args.loader.num_workers=0",
]


def fit(config: str, root, monkeypatch, *extra: str):
    monkeypatch.chdir(root)  # the demos write their data and runs under the working directory
    args = ["fit", "--config", str(CONFIGS / config), *DINOV3, *QUICK, *extra]
    return main([*args, f"--trainer.default_root_dir={root}"])


def test_segmenter_fits_predicts_and_exports(tmp_path, monkeypatch):
    cli = fit("demo_seg.yaml", tmp_path, monkeypatch, "--data.init_args.img_size=48")
    assert type(cli.model.backbone.blocks[0]).__name__ == "EvaBlock" and cli.model.backbone.pos_embed is None
    (ckpt,) = tmp_path.rglob("last.ckpt")
    pixels = np.random.default_rng(0).integers(0, 256, (40, 56, 3), dtype=np.uint8)
    predictor = vitdense.load(ckpt)
    result = predictor(pixels)
    assert result.label_map.shape == (40, 56)

    image = predictor.data.preprocess(pixels)
    # at the image's size (a dynamic DINOv3 graph is tests/test_export.py's)
    path, _, _ = export_checkpoint(ckpt, "onnx", tmp_path / "seg.onnx", *image.shape[-2:], dynamic=False)
    mean, std = torch.tensor(predictor.data.preprocess.mean), torch.tensor(predictor.data.preprocess.std)
    raw = (image * std[:, None, None] + mean[:, None, None]) * 255  # the graph normalises 0..255 itself
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"images": raw[None].numpy()})
    with torch.no_grad():
        expected = predictor.task.model(image[None]).float().numpy()
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    ("config", "extra"),
    [
        ("demo_det_lwdetr.yaml", ["--model.init_args.head.init_args.neck.init_args.feature_indexes=[0, 1]"]),
        ("demo_pretrain_mpp.yaml", []),
        ("demo_pretrain.yaml", ["--model.init_args.objective.init_args.sincos_pos_embed=false"]),
    ],
)
def test_each_task_trains_on_a_dinov3_encoder(tmp_path, monkeypatch, config, extra):
    cli = fit(config, tmp_path, monkeypatch, "--data.init_args.img_size=32", *extra)
    assert cli.trainer.global_step == 1
    assert cli.model.backbone.rope is not None
