"""MaskHungarianMatcher and MaskSetCriterion against Mask2Former's own criterion and matcher.

`mask_criterion_reference.pt` holds inputs and the numbers Mask2Former's code gives for them
(facebookresearch/Mask2Former 9b0651c6 `mask2former/modeling/criterion.py`, `matcher.py`,
`utils/misc.py`, with detectron2 02b5c4e2 `projects/PointRend/point_rend/point_features.py`;
`get_world_size`, `cat`, `shapes_to_tensor` stubbed; weights ce 2, mask 5, dice 5 as its
MaskFormer model applies them; matcher costs 2 / 5 / 5; eos_coef 0.1; oversample 3,
importance 0.75), its `torch.rand` drawing from a generator seeded as the case says, which
our criterion is handed. Inputs: 3 images of 46 x 40, 37 x 44 (no targets) and 40 x 29
pixels with 3, 0 and 4 segments, K = 5, Q = 7, the last block and 2 earlier ones; mask logits
12 x 12 at stride 4 of the 48 x 48 input (the batch padded to 46 x 44, then by the model to
the patch size 16). Mask2Former's targets were zero-padded to 48 x 48 (or, in the
`points64_largest` case, to the largest image, as without `image_sizes`).
"""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from vitdense.core.errors import NonFiniteError
from vitdense.losses import MaskHungarianMatcher, MaskSetCriterion, mask_criterion, point_sample, sample_target_masks
from vitdense.metrics.common import LossMeans
from vitdense.types import ImageSizes, MaskClassOutput, SegmentTargets

REFERENCE = Path(__file__).with_name("mask_criterion_reference.pt")
NAMES = {f"loss_{t}{s}" for t in ("ce", "mask", "dice") for s in ("", "_0", "_1")}


class RecordingMatcher(MaskHungarianMatcher):
    """The matcher, keeping every matching it makes (last block first, then aux 0, 1)."""

    def __init__(self, num_points: int) -> None:
        super().__init__(num_points=num_points)
        self.seen: list[list[tuple[list[int], list[int]]]] = []

    def forward(self, *args, **kwargs):
        matches = super().forward(*args, **kwargs)
        self.seen.append([(q.tolist(), t.tolist()) for q, t in matches])
        return matches


def segment_targets(label_maps, labels) -> list[SegmentTargets]:
    out = []
    for lm, lab in zip(label_maps, labels, strict=True):
        masks = torch.stack([lm == k for k in range(len(lab))]) if len(lab) else torch.zeros(0, *lm.shape).bool()
        out.append(SegmentTargets(masks, lab, torch.zeros(len(lab), dtype=torch.bool)))
    return out


@pytest.fixture(scope="module")
def ref():
    return torch.load(REFERENCE)


@pytest.fixture(scope="module")
def targets(ref):
    return segment_targets(ref["label_maps"], ref["labels"])


def model_output(ref, dtype=torch.float32, requires_grad=False) -> MaskClassOutput:
    (c0, m0), (c1, m1), (c2, m2) = [
        (c.to(dtype).requires_grad_(requires_grad), m.to(dtype).requires_grad_(requires_grad)) for c, m in ref["layers"]
    ]
    return MaskClassOutput(c2, m2, ((c0, m0), (c1, m1)))


def sizes_of(ref, case) -> ImageSizes | None:
    return ImageSizes.of(ref["sizes"]).at_stride(case["stride"]) if case["stride"] else None


@pytest.fixture(scope="module")
def ours(ref, targets):
    """Per reference case, our losses and matchings (last block, aux 0, aux 1)."""
    out = {}
    for name, case in ref["cases"].items():
        matcher = RecordingMatcher(case["num_points"])
        criterion = MaskSetCriterion(5, matcher, num_points=case["num_points"])
        losses = criterion(model_output(ref), targets, sizes_of(ref, case), torch.Generator().manual_seed(case["seed"]))
        out[name] = (losses, dict(zip(("", "_0", "_1"), matcher.seen, strict=True)))
    return out


@pytest.mark.parametrize("case", ["points64", "points12544", "points64_largest"])
def test_losses_equal_mask2formers(ref, ours, case):
    losses, _ = ours[case]
    expected = ref["cases"][case]["losses"]
    assert set(losses.terms) == set(expected) == NAMES
    for name, value in expected.items():
        assert losses.terms[name].item() == pytest.approx(value, abs=1e-5), name
    assert losses.total.item() == pytest.approx(sum(expected.values()), abs=1e-4)
    assert losses.sums == {}  # training mode


@pytest.mark.parametrize("case", ["points64", "points12544", "points64_largest"])
def test_matches_equal_mask2formers(ref, ours, case):
    _, matches = ours[case]
    expected = {block: [(list(q), list(t)) for q, t in m] for block, m in ref["cases"][case]["matches"].items()}
    assert matches == expected
    assert all(m[1] == ([], []) for m in matches.values())  # the image without targets


def test_target_sampling_equals_point_sample_of_the_padded_masks():
    """Targets are read in place, as if zero-padded to the frame and sampled by grid_sample."""
    g = torch.Generator().manual_seed(0)
    masks = torch.rand(4, 13, 9, generator=g) > 0.5
    frame = (16, 12)
    padded = F.pad(masks.float(), (0, 3, 0, 3))
    coords = torch.rand(4, 300, 2, generator=g)
    coords[0, :4] = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.75, 0.8125], [0.7, 0.79]])  # corners, the image's edge
    expected = point_sample(padded[:, None], coords)[:, 0]
    assert torch.allclose(sample_target_masks(masks, coords, frame), expected, atol=1e-6)
    shared = coords[:1]  # one set of points for every mask, as the matcher samples
    assert torch.allclose(sample_target_masks(masks, shared, frame), point_sample(padded[None], shared)[0], atol=1e-6)
    which = torch.tensor([2, 0])
    expected = point_sample(padded[which][:, None], coords[:2])[:, 0]
    assert torch.allclose(sample_target_masks(masks, coords[:2], frame, which), expected, atol=1e-6)


def test_gradients_reach_every_block(ref, targets):
    out = model_output(ref, requires_grad=True)
    case = ref["cases"]["points64"]
    criterion = MaskSetCriterion(5, num_points=64)
    criterion(out, targets, sizes_of(ref, case), torch.Generator().manual_seed(0)).total.backward()
    for class_logits, mask_logits in (out[:2], *out.aux):
        assert class_logits.grad.abs().sum() > 0
        assert mask_logits.grad[[0, 2]].abs().sum() > 0
        assert mask_logits.grad[1].abs().sum() == 0  # no target: no mask is supervised
        assert class_logits.grad[1].abs().sum() > 0  # but every query is "no object"
    assert set(MaskSetCriterion(5, num_points=64, aux_loss=False)(out, targets).terms) == {
        "loss_ce",
        "loss_mask",
        "loss_dice",
    }


def test_batch_without_targets(ref):
    out = model_output(ref, requires_grad=True)
    empty = [SegmentTargets.empty(size) for size in ref["sizes"]]
    matcher = RecordingMatcher(64)
    losses = MaskSetCriterion(5, matcher, num_points=64)(out, empty, ImageSizes.of(ref["sizes"]).at_stride(4))
    assert matcher.seen == [[([], [])] * 3] * 3
    for suffix, (class_logits, _) in zip(("", "_0", "_1"), (out[:2], *out.aux), strict=True):
        assert losses.terms[f"loss_mask{suffix}"].item() == 0 and losses.terms[f"loss_dice{suffix}"].item() == 0
        # every query "no object": the weighted mean of one class is the plain mean
        expected = F.cross_entropy(class_logits.detach().flatten(0, 1), torch.full((21,), 5))
        assert losses.terms[f"loss_ce{suffix}"].item() == pytest.approx(2 * expected.item(), rel=1e-6)
    losses.total.backward()
    assert out.mask_logits.grad.abs().sum() == 0 and out.class_logits.grad.abs().sum() > 0


def test_bfloat16_logits_are_computed_in_float32(ref, targets):
    case = ref["cases"]["points64"]
    half = model_output(ref, torch.bfloat16)
    criterion = MaskSetCriterion(5, num_points=64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        losses = criterion(half, targets, sizes_of(ref, case), torch.Generator().manual_seed(1))
    as_float = MaskClassOutput(
        half.class_logits.float(), half.mask_logits.float(), tuple((c.float(), m.float()) for c, m in half.aux)
    )
    expected = criterion(as_float, targets, sizes_of(ref, case), torch.Generator().manual_seed(1))
    assert losses.total.dtype == torch.float32
    assert {k: v.item() for k, v in losses.terms.items()} == pytest.approx(
        {k: v.item() for k, v in expected.terms.items()}, abs=1e-6
    )


class FirstQueriesMatcher(MaskHungarianMatcher):
    """Target j of every image to query j: a matching that does not depend on the batch."""

    def forward(self, class_logits, mask_logits, targets, frame=None, generator=None):
        return [(torch.arange(len(t.labels)), torch.arange(len(t.labels))) for t in targets]


def test_evaluation_loss_is_the_datasets_whatever_the_batches(monkeypatch):
    """In evaluation each term is a `LossSum`, so the split's figure is its sums over its
    counts for any batching (2 + 0 + 3 masks here: per-batch means weighted by images would
    differ). The random parts are pinned (a fixed matching, a fixed grid of points), as
    batches drawing different points would give each mask different values."""
    grid = torch.stack(torch.meshgrid(torch.linspace(0.01, 0.99, 7), torch.linspace(0.02, 0.97, 7), indexing="xy"), -1)
    monkeypatch.setattr(
        mask_criterion,
        "uncertain_point_coords",
        lambda logits, *args: grid.reshape(1, -1, 2).expand(len(logits), -1, -1),
    )
    g = torch.Generator().manual_seed(3)
    class_logits = torch.randn(3, 4, 4, generator=g)
    mask_logits = torch.randn(3, 4, 4, 4, generator=g) * 3
    masks = torch.rand(5, 16, 16, generator=g) > 0.5
    targets = [
        SegmentTargets(masks[:2], torch.tensor([0, 2]), torch.zeros(2, dtype=torch.bool)),
        SegmentTargets.empty((16, 16)),
        SegmentTargets(masks[2:], torch.tensor([1, 1, 0]), torch.zeros(3, dtype=torch.bool)),
    ]
    out = MaskClassOutput(class_logits, mask_logits, ((class_logits.flip(1), mask_logits.flip(1)),))
    criterion = MaskSetCriterion(3, FirstQueriesMatcher(), num_points=49).eval()

    def dataset_losses(sizes: list[int]) -> dict[str, float]:
        means, start = LossMeans(), 0
        for n in sizes:
            part = slice(start, start + n)
            batch = MaskClassOutput(
                out.class_logits[part], out.mask_logits[part], ((out.aux[0][0][part], out.aux[0][1][part]),)
            )
            means.update("val", criterion(batch, targets[part], ImageSizes.full(n, (16, 16)).at_stride(4)), weight=n)
            start += n
        return {k: v.item() for k, v in means.pop("val").items()}

    whole = criterion(out, targets, ImageSizes.full(3, (16, 16)).at_stride(4))
    expected = {"val/loss": whole.total.item(), **{f"val/{k}": v.item() for k, v in whole.terms.items()}}
    assert len(expected) == 1 + 6 and whole.sums.keys() == whole.terms.keys()
    assert dataset_losses([3]) == pytest.approx(expected, rel=1e-6)
    for sizes in ([1, 1, 1], [2, 1], [1, 2]):
        assert dataset_losses(sizes) == pytest.approx(expected, rel=1e-6), sizes
    # training mode on one process: the same figures for the whole batch, and no sums
    trained = criterion.train()(out, targets, ImageSizes.full(3, (16, 16)).at_stride(4))
    assert {k: v.item() for k, v in trained.terms.items()} == pytest.approx(
        {k: v.item() for k, v in whole.terms.items()}, rel=1e-6
    )
    assert trained.sums == {}
    # the per-batch means weighted by images, which the sums replace, are off here
    means = [
        criterion.eval()(MaskClassOutput(out.class_logits[p], out.mask_logits[p]), targets[p])
        for p in (slice(0, 2), slice(2, 3))
    ]
    naive = (2 * means[0].terms["loss_mask"] + means[1].terms["loss_mask"]) / 3
    assert abs(naive.item() - whole.terms["loss_mask"].item()) > 1e-3  # vs the 5e-6 tolerance above


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda o, t, s: (o, t, s.at_stride(1)), "image_sizes.at_stride"),
        (lambda o, t, s: (o, t[:2], s), "targets do not match"),
        (lambda o, t, s: (o, [t[0], t[2], t[1]], s), r"targets\[1\]: SegmentTargets.masks are 40 x 29"),
        (lambda o, t, s: (o._replace(class_logits=o.class_logits[..., :4]), t, s), "num_classes 5"),
        (lambda o, t, s: (o, [t[0]._replace(labels=t[0].labels + 5), *t[1:]], s), r"targets\[0\]: .*\[0, 5\)"),
        (lambda o, t, s: (o, [t[0]._replace(masks=t[0].masks[:2]), *t[1:]], s), r"one mask per label"),
    ],
)
def test_bad_input_fails_early(ref, targets, change, message):
    out, bad_targets, sizes = change(model_output(ref), targets, ImageSizes.of(ref["sizes"]).at_stride(4))
    with pytest.raises(ValueError, match=message):
        MaskSetCriterion(5, num_points=16)(out, bad_targets, sizes)


def test_non_finite_logits_name_the_query(ref, targets):
    out = model_output(ref)
    mask_logits = out.mask_logits.clone()
    mask_logits[2, 4] = float("nan")
    with pytest.raises(NonFiniteError, match="image 2 of the batch, query 4") as error:
        MaskSetCriterion(5, num_points=16)(out._replace(mask_logits=mask_logits), targets)
    assert (error.value.image, error.value.query) == (2, 4)
