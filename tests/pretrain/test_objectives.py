"""The objectives on a tiny backbone: padding is never visible nor a target (what a padded
batch holds there changes nothing), MAE's decoder puts every visible token back at its own
position and the mask token everywhere else, MAE's fixed sine-cosine encoder table."""

from functools import partial

import numpy as np
import pytest
import torch

import vitdense.pretrain.objectives as objectives
from vitdense.backbone import VisionTransformer, create_backbone
from vitdense.backbone.pos_embed import sincos_2d
from vitdense.pretrain import MaskedAutoencoder, MaskedPatchPrediction, MeanColorTarget, PixelTarget, random_masking
from vitdense.pretrain.masking import valid_tokens
from vitdense.types import ImageSizes

OBJECTIVES = {
    "mae": partial(MaskedAutoencoder, decoder_embed_dim=32, decoder_depth=1, decoder_num_heads=2, norm_pix_loss=True),
    "mpp": MaskedPatchPrediction,
    "mpp_4x4": partial(MaskedPatchPrediction, target=partial(MeanColorTarget, cells=4)),
    "mpp_l2": partial(MaskedPatchPrediction, target=PixelTarget),
}
SIZES = ImageSizes.of([(32, 40), (20, 27), (8, 16)])  # patch 8: grids 4x5, 3x4, 1x2


@pytest.fixture(scope="module")
def backbone():
    torch.manual_seed(0)
    return create_backbone("vit_tiny_patch16_224", img_size=32, model_args={"depth": 2, "patch_size": 8}).eval()


def padded_batch(garbage: float) -> torch.Tensor:
    images = torch.randn(3, 3, 32, 40, generator=torch.Generator().manual_seed(1))
    tokens = SIZES.at_stride(8).mask()  # [B, 4, 5], True on whole padding tokens
    pixels = tokens.repeat_interleave(8, 1).repeat_interleave(8, 2)[:, None].expand_as(images)
    pixel_padding = SIZES.mask()[:, None].expand_as(images)
    images = images.masked_fill(pixel_padding, 0.0)  # as pad_collate pads
    return images.masked_fill(pixels, garbage)  # what whole padding tokens hold


@pytest.mark.parametrize("name", OBJECTIVES)
def test_padding_is_never_visible_nor_a_target(backbone, name):
    objective = OBJECTIVES[name](backbone.embed_dim, backbone.patch_size, 3).eval()
    outputs = []
    for garbage in (0.0, 7.0):
        with torch.no_grad():
            outputs.append(objective(backbone, padded_batch(garbage), SIZES, torch.Generator().manual_seed(2)))
    clean, noisy = outputs
    valid = valid_tokens(SIZES.at_stride(8))
    assert not (clean.hidden & ~valid).any() and torch.equal(clean.hidden, noisy.hidden)
    torch.testing.assert_close(clean.pred[valid], noisy.pred[valid], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(objective.loss(clean), objective.loss(noisy), rtol=1e-5, atol=1e-6)
    assert torch.isfinite(objective.loss(clean))


def test_mae_decoder_returns_each_visible_token_to_its_position(backbone, monkeypatch):
    d = backbone.embed_dim
    mae = MaskedAutoencoder(d, backbone.patch_size, 3, decoder_embed_dim=d, decoder_depth=0, decoder_num_heads=3)
    with torch.no_grad():  # the decoder's input projection an identity, no blocks: its input is readable
        mae.decoder_embed.weight.copy_(torch.eye(d))
        mae.decoder_embed.bias.zero_()
    seen = {}

    def masking(*args, **kwargs):
        seen["masking"] = random_masking(*args, **kwargs)
        return seen["masking"]

    def forward_tokens(*args, **kwargs):
        out = VisionTransformer.forward_tokens(backbone, *args, **kwargs)
        seen["latent"] = out[0]  # [B, 1 + K, D]: the encoder's output
        return out

    monkeypatch.setattr(objectives, "random_masking", masking)
    monkeypatch.setattr(backbone, "forward_tokens", forward_tokens)
    with torch.no_grad():
        out = mae(backbone, padded_batch(0.0), SIZES, torch.Generator().manual_seed(3))
    latent, m = seen["latent"], seen["masking"]
    pos = sincos_2d(d, (4, 5))
    head = lambda z: mae.decoder_pred(mae.decoder_norm(z))  # noqa: E731
    valid = valid_tokens(SIZES.at_stride(8))
    assert m.num_keep == (5, 3, 0) and not m.filled  # the 1 x 2 image keeps int(2 * 0.25) = 0 tokens
    for b in range(3):
        visible = m.ids_keep[b][m.keep_valid[b]].tolist()
        for slot, position in enumerate(visible):
            torch.testing.assert_close(out.pred[b, position], head(latent[b, 1 + slot] + pos[position]))
        for position in valid[b].nonzero().flatten().tolist():
            if position not in visible:
                assert out.hidden[b, position]
                torch.testing.assert_close(out.pred[b, position], head(mae.mask_token[0, 0] + pos[position]))


def test_mae_sets_a_fixed_sincos_encoder_table_when_training_from_scratch():
    backbone = create_backbone("vit_tiny_patch16_224", img_size=32, model_args={"depth": 1, "patch_size": 8})
    MaskedAutoencoder(backbone.embed_dim, backbone.patch_size).prepare_backbone(backbone)
    assert not backbone.pos_embed.requires_grad
    torch.testing.assert_close(backbone.pos_embed[0, 0], torch.zeros(backbone.embed_dim))  # the class token's
    torch.testing.assert_close(backbone.pos_embed[0, 1:], sincos_2d(backbone.embed_dim, (4, 4)))
    kept = create_backbone("vit_tiny_patch16_224", img_size=32, model_args={"depth": 1, "patch_size": 8})
    before = kept.pos_embed.detach().clone()
    MaskedAutoencoder(kept.embed_dim, kept.patch_size, sincos_pos_embed=False).prepare_backbone(kept)
    assert kept.pos_embed.requires_grad and torch.equal(kept.pos_embed, before)


def test_windowed_backbones_are_refused_by_mae():
    backbone = create_backbone(
        "vit_tiny_patch16_224", img_size=32, model_args={"depth": 1, "patch_size": 8, "window_size": 2}
    )
    mae = MaskedAutoencoder(backbone.embed_dim, backbone.patch_size, decoder_embed_dim=32, decoder_depth=1)
    with pytest.raises(ValueError, match="windowed"):
        mae(backbone, torch.zeros(1, 3, 32, 32))


@pytest.mark.parametrize(("name", "names"), [("mae", 3), ("mpp", 4)])
def test_validation_pictures_show_the_hidden_patches_and_the_prediction(name, names):
    from vitdense.tasks import BackboneConfig, MaskedImageModelingTask
    from vitdense.tasks.pictures import masked_panels
    from vitdense.types import LabeledImages

    backbone = BackboneConfig(img_size=32, model_args={"depth": 1, "patch_size": 8})
    task = MaskedImageModelingTask(objective=OBJECTIVES[name], backbone=backbone).eval()
    batch = LabeledImages(padded_batch(0.0), torch.full((3,), -1), torch.arange(3), SIZES)
    with torch.no_grad():
        output = task.forward_batch(batch, "val")
        panels = masked_panels(task.objective, output, batch.image)
        pictures = task.draw_batch(batch, [], None)
    assert len(panels) == names and ("true target" in panels) == (name == "mpp")
    hidden = output.hidden.reshape(3, 1, 4, 1, 5, 1).expand(3, 3, 4, 8, 5, 8).reshape(3, 3, 32, 40)
    inputs = (batch.image * task.objective.pixel_std[:, None, None] + task.objective.pixel_mean[:, None, None]).clamp(
        0, 1
    )
    torch.testing.assert_close(panels["input"], inputs)
    assert (panels["hidden (grey)"][hidden] == 0.5).all()
    for shown in ("hidden (grey)", "prediction"):  # visible patches show the input
        torch.testing.assert_close(panels[shown][~hidden], inputs[~hidden])
    assert not torch.equal(panels["prediction"][hidden], inputs[hidden])
    assert len(pictures) == 3 and all(p.ndim == 3 and p.shape[2] == 3 and p.dtype == np.uint8 for p in pictures)


def test_mae_decoder_follows_the_backbones_gradient_checkpointing():
    from vitdense.tasks import BackboneConfig, MaskedImageModelingTask

    backbone = BackboneConfig(img_size=32, model_args={"depth": 1, "patch_size": 8}, grad_checkpointing=True)
    task = MaskedImageModelingTask(objective=OBJECTIVES["mae"], backbone=backbone)
    assert task.objective.grad_checkpointing
    batch = padded_batch(0.0)
    loss = task.objective.loss(task.model(batch, SIZES, torch.Generator().manual_seed(0)))
    loss.backward()  # through the recomputed decoder blocks
    assert task.objective.decoder_blocks[0].attn.qkv.weight.grad is not None
