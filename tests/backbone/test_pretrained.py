"""Building from timm names and loading weight files: coverage, conversions, clear errors."""

import pytest
import timm
import torch
from timm.models.vision_transformer import VisionTransformer as TimmViT

from vitdense.backbone import CheckpointError, VisionTransformer, create_backbone
from vitdense.backbone.config import BackboneConfig

# one name per size, patch size and family the issue names; built on the meta device (shapes only)
PLAIN_FAMILY = [
    "vit_tiny_patch16_224",
    "vit_small_patch32_384",
    "vit_small_patch8_224",
    "vit_base_patch16_224",
    "vit_base_patch32_224",
    "vit_large_patch14_224",
    "vit_large_patch16_384",
    "vit_huge_patch14_224",
    "deit_small_patch16_224",
    "deit_base_distilled_patch16_384",
    "deit3_small_patch16_224",
    "vit_small_patch14_reg4_dinov2",
    "vit_base_patch16_gap_224",
    "vit_small_r26_s32_224",
    "vit_base_r50_s16_384",
    "vit_large_r50_s32_384",
    "vit_tiny_r_s16_p8_224",
]


@pytest.mark.parametrize("name", PLAIN_FAMILY)
def test_every_plain_name_builds_timms_architecture(name):
    with torch.device("meta"):
        ours = create_backbone(name)
        ref = timm.create_model(name, pretrained=False, num_classes=0)
    ours_shapes = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    ref_shapes = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    assert ours_shapes == ref_shapes
    assert ours.patch_size == tuple(ref.patch_embed.feat_ratio(as_scalar=False))
    assert ours.num_prefix_tokens == ref.num_prefix_tokens
    assert ours.pretrained_cfg["mean"] == ref.pretrained_cfg["mean"]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(reg_tokens=4, no_embed_class=True, init_values=1e-2),  # DINOv2-reg / DeiT-III style
        dict(class_token=False, global_pool="avg", fc_norm=False),  # GAP model, no prefix at all
        dict(qkv_bias=False, mlp_ratio=3.0, patch_size=8),
    ],
)
def test_architecture_options_match_timm(kwargs):
    """Features the named test models do not cover, checked directly against timm's class."""
    base = dict(img_size=64, patch_size=16, embed_dim=64, depth=2, num_heads=4)
    ref = TimmViT(**(base | kwargs), num_classes=0, dynamic_img_size=True).eval()
    ours_kwargs = {k: v for k, v in (base | kwargs).items() if k not in ("global_pool", "fc_norm")}
    ours = VisionTransformer(**ours_kwargs).eval()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 48, 96)
    with torch.no_grad():
        expected, f = ref.forward_features(x), ours(x)
    p = ref.num_prefix_tokens
    torch.testing.assert_close(f.patch_tokens, expected[:, p:], rtol=0, atol=1e-5)
    torch.testing.assert_close(f.prefix_tokens, expected[:, :p], rtol=0, atol=1e-5)


def test_training_checkpoints_are_unwrapped_and_heads_dropped(tmp_path, caplog):
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10)
    wrapped = {"state_dict": {f"backbone.{k}": v for k, v in ref.state_dict().items()}, "epoch": 3}
    torch.save(wrapped, tmp_path / "last.ckpt")
    with caplog.at_level("INFO"):
        ours = create_backbone("vit_tiny_patch16_224", checkpoint=tmp_path / "last.ckpt")
    assert "dropped 2 classification-head tensors (head.weight, head.bias)" in caplog.text
    torch.testing.assert_close(ours.blocks[5].mlp.fc2.weight, ref.blocks[5].mlp.fc2.weight, rtol=0, atol=0)


def test_wrong_architecture_lists_the_keys(tmp_path):
    ref = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=0)
    torch.save(ref.state_dict(), tmp_path / "small.pth")
    with pytest.raises(CheckpointError) as err:
        create_backbone("vit_tiny_patch16_224", checkpoint=tmp_path / "small.pth")
    msg = str(err.value)
    assert (
        "small.pth does not fit" in msg
        and "shape mismatch" in msg
        and "cls_token: checkpoint (1, 1, 384) vs model (1, 1, 192)" in msg
    )
    sd = ref.state_dict()
    sd.pop("norm.bias")
    sd["extra.weight"] = torch.zeros(1)
    torch.save(sd, tmp_path / "broken.pth")
    with pytest.raises(CheckpointError, match=r"missing \(1\): norm.bias[\s\S]*unexpected \(1\): extra.weight"):
        create_backbone("vit_small_patch16_224", checkpoint=tmp_path / "broken.pth")


def test_bad_files_and_names_fail_early(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.safetensors does not exist"):
        create_backbone("vit_tiny_patch16_224", checkpoint=tmp_path / "nope.safetensors")
    with pytest.raises(FileNotFoundError, match="nope.npz does not exist"):
        create_backbone("vit_tiny_patch16_224", checkpoint=tmp_path / "nope.npz")
    (tmp_path / "corrupt.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="cannot read checkpoint .*corrupt.safetensors"):
        create_backbone("vit_tiny_patch16_224", checkpoint=tmp_path / "corrupt.safetensors")
    (tmp_path / "w.onnx").write_bytes(b"")
    with pytest.raises(CheckpointError, match="unknown format '.onnx'"):
        create_backbone("vit_tiny_patch16_224", checkpoint=tmp_path / "w.onnx")
    with pytest.raises(ValueError, match="Did you mean vit_tiny_patch16_224"):
        create_backbone("vit_tiny_patch16_22")
    with pytest.raises(ValueError, match="outside vitdense's plain ViT family: pre-encoder norm"):
        create_backbone("vit_base_patch16_clip_224")
    with pytest.raises(ValueError, match="either pretrained=True or checkpoint"):
        create_backbone("vit_tiny_patch16_224", pretrained=True, checkpoint="w.pth")
    # a task would load the file, then fetch the hub's weights over it in setup (and fail offline)
    with pytest.raises(ValueError, match="pretrained=true and checkpoint=w.pth both given; .* set pretrained: false"):
        BackboneConfig(pretrained=True, checkpoint="w.pth")


def test_pretrained_offline_says_what_to_do(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="pass checkpoint="):
        create_backbone("vit_tiny_patch16_224.augreg_in21k", pretrained=True)
