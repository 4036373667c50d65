"""vitdense reproduces timm's `forward_features` to 1e-5 (fp32, CPU) from saved timm weights."""

import pytest
import timm
import torch
from safetensors.torch import save_file

from tests.backbone.jax_export import export_npz
from vitdense.backbone import create_backbone

# (timm name, sizes: native, non-square off-grid, not a multiple of the patch size; ViT-B/R50's
# two others smaller than its native 384, which alone took 5 s a forward pass on 2 cores)
CASES = [
    ("vit_tiny_patch16_224", [(224, 224), (160, 288), (150, 203)]),
    ("deit_tiny_distilled_patch16_224", [(224, 224), (192, 256), (131, 250)]),
    ("vit_base_r50_s16_384", [(384, 384), (128, 192), (122, 181)]),
]


def timm_reference(name: str, **kwargs) -> torch.nn.Module:
    return timm.create_model(
        name, pretrained=False, num_classes=0, dynamic_img_size=True, dynamic_img_pad=True, **kwargs
    ).eval()


def assert_matches_timm(ours, ref, sizes, batch=2):
    prefix = ref.num_prefix_tokens
    for size in sizes:
        x = torch.randn(batch, 3, *size)
        with torch.no_grad():
            expected = ref.forward_features(x)
            f = ours(x)
        # (timm's dynamic_feat_size floors, but its hybrid CNN's SAME padding rounds up)
        stride = ours.patch_size
        assert f.grid_size == (-(-size[0] // stride[0]), -(-size[1] // stride[1]))
        assert f.patch_tokens.shape == expected[:, prefix:].shape
        torch.testing.assert_close(f.prefix_tokens, expected[:, :prefix], rtol=0, atol=1e-5)
        torch.testing.assert_close(f.patch_tokens, expected[:, prefix:], rtol=0, atol=1e-5)
        torch.testing.assert_close(f.cls_token, expected[:, 0], rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def references():
    """timm's model of a name, built once for both file formats (seeded: the weights a test
    building its own would have); one name kept at a time (ViT-B/R50 holds 100M parameters)."""
    built: dict[str, torch.nn.Module] = {}

    def reference(name: str) -> torch.nn.Module:
        if name not in built:
            built.clear()
            torch.manual_seed(0)
            built[name] = timm_reference(name)
        return built[name]

    return reference


@pytest.mark.parametrize("fmt", ["safetensors", "pth"])
@pytest.mark.parametrize(("name", "sizes"), CASES, ids=[c[0] for c in CASES])
def test_forward_matches_timm(tmp_path, name, sizes, fmt, references):
    ref = references(name)
    path = tmp_path / f"w.{fmt}"
    if fmt == "safetensors":
        save_file(ref.state_dict(), str(path))
    else:
        torch.save({"model": ref.state_dict()}, path)  # DeiT-style wrapped checkpoint
    ours = create_backbone(name, checkpoint=path).eval()
    # the format changes only the loading: every size once, the second format at the odd size
    assert_matches_timm(ours, ref, sizes if fmt == "safetensors" else sizes[-1:])


def test_jax_npz_matches_timm(tmp_path):
    """An original google-research/vision_transformer .npz, read by timm's converter."""
    ref = timm_reference("vit_tiny_patch16_224")
    export_npz(ref, tmp_path / "ViT-Ti_16.npz")
    ours = create_backbone("vit_tiny_patch16_224", checkpoint=tmp_path / "ViT-Ti_16.npz").eval()
    assert_matches_timm(ours, ref, [(224, 224), (176, 240)])


def test_img_size_resamples_like_timm(tmp_path):
    """Loading at another native size resamples the table exactly as timm's filter does."""
    src = timm_reference("vit_tiny_patch16_224")
    torch.save(src.state_dict(), tmp_path / "w.pth")
    ref = timm_reference("vit_tiny_patch16_224", img_size=288, pretrained_cfg_overlay={"file": str(tmp_path / "w.pth")})
    ref.load_state_dict(timm.models.vision_transformer.checkpoint_filter_fn(torch.load(tmp_path / "w.pth"), ref))
    ours = create_backbone("vit_tiny_patch16_224", checkpoint=tmp_path / "w.pth", img_size=288).eval()
    assert ours.grid_size == (18, 18)
    torch.testing.assert_close(ours.pos_embed, ref.pos_embed, rtol=0, atol=0)
    assert_matches_timm(ours, ref, [(288, 288), (224, 320)])
