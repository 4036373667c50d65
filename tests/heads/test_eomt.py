"""EoMT (`vitdense.models.EoMT` + `vitdense.heads.eomt`) against EoMT's own code.

`eomt_reference.pt` holds outputs of tue-mps/eomt's `models/eomt.py` (`EoMT` with its
`ScaleBlock`, commit 7bd19dd) around timm's `VisionTransformer` (the `encoder.backbone` of
its `models/vit.py`, pixel mean 0 and std 1), computed once on the model `tiny_eomt` builds
here: 48 x 64 images, patch 16, width 48, 4 blocks of 3 heads with LayerScale, a class token
and 2 registers (position embeddings on the patches only, as DINOv2's), 6 queries joined to
the last 2 blocks, 5 classes; every parameter a fixed random draw (`fill`), the same
numbers in EoMT's names. Three runs on the same 2 images:

- `masked`: evaluation, `attn_mask_probs` [1, 1]: masks restrict the queries in both
  joined blocks. Class logits of every block and the mask logits of the last two.
- `annealing`: training, [1.0, 0.4], `torch.manual_seed(seed)` before the forward: the
  second block lifts each query's mask with probability 0.6 by EoMT's `torch.rand` draw.
- `unmasked`: evaluation, [0, 0]: annealing over, EoMT lifts every mask.

The fixture also keeps the sums of the weights and images, so that a change in what
`torch.randn` draws is told apart from a change in the model.
"""

from pathlib import Path

import pytest
import torch

from vitdense.backbone import VisionTransformer
from vitdense.core.errors import ConfigError
from vitdense.heads.eomt import EoMTHead, eomt_state_dict
from vitdense.models.universal import EoMT
from vitdense.types import ImageSizes

REFERENCE = Path(__file__).with_name("eomt_reference.pt")
BACKBONE = dict(
    img_size=(48, 64),
    patch_size=16,
    embed_dim=48,
    depth=4,
    num_heads=3,
    init_values=1.0,
    reg_tokens=2,
    no_embed_class=True,
)
HEAD = dict(num_classes=5, num_queries=6, num_blocks=2)


@torch.no_grad()
def fill(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter a fixed random draw in `state_dict` order, at a scale that keeps the
    activations of order one (norm and LayerScale weights about 1, biases about 0.1,
    embeddings 0.5, weights 1 / sqrt(fan-in)), so that masks take both signs."""
    generator = torch.Generator().manual_seed(seed)
    for name, tensor in model.state_dict().items():
        if name.endswith("attn_mask_probs"):
            continue
        noise = torch.randn(tensor.shape, generator=generator)
        if name.endswith(("norm.weight", "norm1.weight", "norm2.weight", "gamma")):
            tensor.copy_(1 + 0.1 * noise)
        elif name.endswith(("pos_embed", "cls_token", "reg_token", "q.weight")):
            tensor.copy_(0.5 * noise)
        elif tensor.ndim == 1:
            tensor.copy_(0.1 * noise)
        else:
            tensor.copy_(noise * tensor[0].numel() ** -0.5)
    return model


def tiny_eomt(**backbone_args) -> EoMT:
    """vitdense's EoMT of the fixture's sizes (`backbone_args` override), weights `fill`ed."""
    backbone = VisionTransformer(**{**BACKBONE, **backbone_args})
    head = EoMTHead(backbone.embed_dim, patch_size=backbone.patch_size[0], **HEAD)
    return fill(EoMT(backbone, head))


def images(batch: int = 2, size: tuple[int, int] = BACKBONE["img_size"], seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, *size, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def ref():
    return torch.load(REFERENCE, weights_only=True)


@pytest.fixture(scope="module")
def model():
    return tiny_eomt()


def run(model: EoMT, probs: list[float], train: bool, seed: int | None = None):
    model.head.attn_mask_probs.copy_(torch.tensor(probs))
    model.train(train)
    if seed is not None:
        torch.manual_seed(seed)
    with torch.no_grad():
        return model(images())


def test_inputs_are_the_fixtures(model, ref):
    """The weights and images are what EoMT's code was run on (else torch.randn changed:
    regenerate the fixture with the throwaway script)."""
    state = model.state_dict()
    weights = sum(v.double().sum() for k, v in state.items() if not k.endswith("attn_mask_probs"))
    assert weights.item() == pytest.approx(ref["weights_sum"], rel=1e-9)
    assert images().double().sum().item() == pytest.approx(ref["images_sum"], rel=1e-9)


def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)


def test_masked_attention_equals_eomts(model, ref):
    """Evaluation with masks in both joined blocks: every block's prediction is EoMT's."""
    out = run(model, [1.0, 1.0], train=False)
    assert len(out.aux) == 2
    blocks = [*out.aux, (out.class_logits, out.mask_logits)]
    close(torch.stack([c for c, _ in blocks]), ref["masked"]["class_logits"])
    close(torch.stack([m for _, m in blocks[-2:]]), ref["masked"]["mask_logits"])


def test_annealing_draws_equal_eomts(model, ref):
    """Training with the second block's masks kept with probability 0.4: the same seed lifts
    the same queries as EoMT's `torch.rand(B, Q) > p`, and the draw matters."""
    expected = ref["annealing"]
    out = run(model, [1.0, 0.4], train=True, seed=expected["seed"])
    close(torch.stack([c for c, _ in (*out.aux, (out.class_logits, None))]), expected["class_logits"])
    close(out.mask_logits, expected["mask_logits"])
    other = run(model, [1.0, 0.4], train=True, seed=expected["seed"] + 1)
    assert (other.mask_logits - expected["mask_logits"]).abs().max() > 0.1


def test_finished_annealing_equals_eomt_without_masks(model, ref):
    """Evaluation at probabilities 0 (EoMT lifts every mask): no masks, no earlier predictions."""
    out = run(model, [0.0, 0.0], train=False)
    assert out.aux == ()
    close(out.class_logits, ref["unmasked"]["class_logits"])
    close(out.mask_logits, ref["unmasked"]["mask_logits"])
    # the masks of the first run matter: the two differ
    assert (ref["masked"]["mask_logits"][-1] - out.mask_logits).abs().max() > 1


def eomt_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """vitdense's tensors under EoMT's names in its Lightning checkpoints, with its pixel
    statistics (ImageNet's) and loss weight."""
    named = {
        f"network.encoder.{k}" if k.startswith("backbone.") else f"network.{k.removeprefix('head.')}": v
        for k, v in state.items()
    }
    named["network.encoder.pixel_mean"] = torch.tensor([0.485, 0.456, 0.406]).reshape(1, 3, 1, 1)
    named["network.encoder.pixel_std"] = torch.tensor([0.229, 0.224, 0.225]).reshape(1, 3, 1, 1)
    named["criterion.empty_weight"] = torch.ones(HEAD["num_classes"] + 1)
    return named


@pytest.mark.parametrize("form", ["checkpoint", "state_dict", "network"])
def test_eomt_state_dict_loads_eomts_weights(model, ref, form, caplog):
    """EoMT's names (as its model holds them: the fixture's list) map onto vitdense's model,
    strictly, from a Lightning checkpoint, its state dict or the network's own."""
    named = eomt_names(model.state_dict())
    assert sorted(named) == ref["reference_keys"]
    if form == "checkpoint":
        named = {"state_dict": named, "epoch": 3}
    elif form == "network":
        named = {k.removeprefix("network."): v for k, v in named.items() if k.startswith("network.")}
    fresh = EoMT(VisionTransformer(**BACKBONE), EoMTHead(48, **HEAD))
    fresh.load_state_dict(eomt_state_dict(named), strict=True)
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    assert "ImageNet" not in caplog.text  # ImageNet's statistics: nothing to warn of


def test_eomt_state_dict_refuses_what_does_not_fit(caplog):
    with pytest.raises(ConfigError, match="rotary"):
        eomt_state_dict({"network.encoder.backbone.blocks.0.attention.q_proj.weight": torch.zeros(1)})
    with pytest.raises(ConfigError, match="network.decoder.weight: not a tensor of EoMT's network"):
        eomt_state_dict({"network.decoder.weight": torch.zeros(1)})
    eomt_state_dict({"encoder.pixel_mean": torch.zeros(1, 3, 1, 1)})
    assert "not ImageNet's" in caplog.text


SIZES = [(40, 60), (60, 36)]  # grids 3x4 and 4x3, padded together to 60x60 (4x4)


def test_padded_batch_equals_images_alone(model):
    """Evaluation with masks on: each image's class logits and mask logits at its pixels are
    the same padded into a batch as alone."""
    model.head.attn_mask_probs.fill_(1.0)
    model.eval()
    alone = [torch.randn(1, 3, *size) for size in SIZES]
    sizes = ImageSizes.of(SIZES)
    batch = torch.zeros(2, 3, *sizes.padded)
    for i, (h, w) in enumerate(SIZES):
        batch[i, :, :h, :w] = alone[i][0]
    with torch.no_grad():
        together = model.image_logits(model(batch, sizes), sizes)
        for i, image in enumerate(alone):
            (classes, masks), *_ = model.image_logits(model(image), ImageSizes.full(1, SIZES[i]))
            assert masks.shape == (HEAD["num_queries"], *SIZES[i])
            torch.testing.assert_close(together[i][0], classes, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(together[i][1], masks, rtol=1e-4, atol=1e-4)


def test_training_reaches_every_part():
    """A training forward gives num_blocks earlier predictions; a loss on all of them sends
    gradients to the queries, both heads, the upscaling and the backbone."""
    model = tiny_eomt().train()
    out = model(images())
    assert len(out.aux) == HEAD["num_blocks"]
    loss = sum(c.pow(2).mean() + m.pow(2).mean() for c, m in (*out.aux, (out.class_logits, out.mask_logits)))
    loss.backward()
    for name in (
        "head.q.weight",
        "head.class_head.weight",
        "head.mask_head.0.weight",
        "head.upscale.0.conv1.weight",
        "head.upscale.1.norm.weight",
        "backbone.blocks.0.attn.qkv.weight",
        "backbone.patch_embed.proj.weight",
        "backbone.pos_embed",
    ):
        grad = model.get_parameter(name).grad
        assert grad is not None and grad.abs().sum() > 0, name


def test_configurations_that_cannot_work():
    head = EoMTHead(48, **HEAD)
    with pytest.raises(ConfigError, match="joins its queries to 2 blocks, but the backbone has 1"):
        EoMT(VisionTransformer(**{**BACKBONE, "depth": 1}), head)
    windowed = {**BACKBONE, "window_size": 2}
    with pytest.raises(ConfigError, match=r"blocks \[2\] of the backbone attend within windows"):
        EoMT(VisionTransformer(**windowed, global_attn_indexes=(3,)), head)
    EoMT(VisionTransformer(**windowed, global_attn_indexes=(2, 3)), head)  # the joined blocks global: fine


def test_patch_14_upscales_once():
    """Patch 14 (DINOv2's own): one ScaleBlock, masks at 1/7 of the input."""
    backbone = VisionTransformer(**{**BACKBONE, "img_size": (28, 42), "patch_size": 14})
    model = EoMT(backbone, EoMTHead(48, patch_size=14, **HEAD)).eval()
    assert len(model.head.upscale) == 1 and model.mask_stride == 7
    with torch.no_grad():
        out = model(torch.randn(1, 3, 28, 42))
    assert out.mask_logits.shape == (1, HEAD["num_queries"], 4, 6)


def test_bf16_autocast_forward(model):
    model.head.attn_mask_probs.fill_(1.0)
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(images())
    assert out.class_logits.shape == (2, HEAD["num_queries"], HEAD["num_classes"] + 1)
    assert out.mask_logits.shape == (2, HEAD["num_queries"], 12, 16) and len(out.aux) == 2
    assert torch.isfinite(out.mask_logits.float()).all() and torch.isfinite(out.class_logits.float()).all()
