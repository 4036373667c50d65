"""Parameter groups and the warmup-cosine schedule."""

import math

import pytest
import torch

from vitdense.backbone import VisionTransformer
from vitdense.heads import ClassificationHead
from vitdense.training.optim import TwoStageWarmupPolyLR, WarmupCosineLR, WarmupMultiStepLR, param_groups


def test_param_groups_decay_and_layer_scales():
    bb = VisionTransformer(img_size=32, embed_dim=32, depth=2, num_heads=2)
    head = ClassificationHead(32, 5)
    groups = param_groups(bb, head, backbone_lr_scale=0.5, layer_decay=0.1)
    by_name = {n: g for g in groups for n in g["names"]}
    assert len(by_name) == sum(1 for _ in bb.parameters()) + 2  # every parameter exactly once
    assert by_name["head.fc.weight"]["lr_scale"] == 1.0 and "weight_decay" not in by_name["head.fc.weight"]
    assert by_name["head.fc.bias"]["weight_decay"] == 0.0
    # num_layers = 4: the final norm is layer 3 (scale 0.5 * 0.1**0), block 1 is layer 2, embeddings layer 0
    assert by_name["backbone.norm.weight"]["lr_scale"] == pytest.approx(0.5)
    assert by_name["backbone.blocks.1.attn.qkv.weight"]["lr_scale"] == pytest.approx(0.05)
    assert by_name["backbone.pos_embed"]["lr_scale"] == pytest.approx(0.5e-3)
    assert by_name["backbone.pos_embed"]["weight_decay"] == 0.0
    assert "weight_decay" not in by_name["backbone.blocks.0.mlp.fc1.weight"]
    bb.freeze()
    assert {n for g in param_groups(bb, head) for n in g["names"]} == {"head.fc.weight", "head.fc.bias"}


def test_warmup_then_cosine_per_step():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = WarmupCosineLR(opt, warmup_steps=4, total_steps=14, min_lr_ratio=0.1)
    lrs = []
    for _ in range(14):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert lrs[4] == pytest.approx(1.0)
    assert lrs[9] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)  # decayed to the floor at total_steps


def test_multistep_drops_at_epoch_milestones_after_warmup():
    """DETR's x0.1 at epoch 200 of 300, written in epochs: with 10 steps per epoch the drop
    comes at step 2000 (and at step 20 for a 3-epoch run with 10 steps per epoch and
    milestone_epochs [2])."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = WarmupMultiStepLR(opt, milestone_epochs=[2], milestones=[25], gamma=0.1, warmup_steps=4)
    sched.resolve(30, 10.0)
    lrs = []
    for _ in range(30):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert lrs[4:20] == pytest.approx([1.0] * 16)
    assert lrs[20:25] == pytest.approx([0.1] * 5)  # epoch 2 starts at step 20
    assert lrs[25:] == pytest.approx([0.01] * 5)  # and the step milestone drops again


def test_two_stage_warmup_is_eomts_schedule():
    """EoMT's TwoStageWarmupPolySchedule (tue-mps/eomt, training/two_stage_warmup_poly_schedule.py)
    with warmup_steps (2, 4), 16 steps, power 0.9: the head warms up while the backbone's rate
    is 0, then the backbone warms up; each decays from the end of its own warmup. The numbers
    are that class's for base rate 1."""
    head = [0.0, 0.5, 1.0, 0.935478, 0.870458, 0.804893, 0.738728, 0.671898, 0.604318, 0.535887, 0.466467]
    head += [0.395875, 0.323846, 0.249973, 0.173545, 0.093]
    backbone = [0.0, 0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 0.909533, 0.818052, 0.725418, 0.631446, 0.535887, 0.438383]
    backbone += [0.338383, 0.234924, 0.125893]
    model = VisionTransformer(img_size=32, patch_size=16, embed_dim=16, depth=1, num_heads=2)
    groups = param_groups(model, ClassificationHead(16, 3))
    assert {g["backbone"] for g in groups} == {True, False}
    opt = torch.optim.SGD(groups, lr=1.0)
    schedule = TwoStageWarmupPolyLR(opt, warmup_steps=2, backbone_warmup_steps=4, total_steps=16)
    seen = {True: [], False: []}
    for _ in range(16):
        for g in opt.param_groups:
            seen[g["backbone"]].append(g["lr"])
        opt.step()
        schedule.step()
    n = len([g for g in opt.param_groups if g["backbone"]])
    assert seen[True][::n] == pytest.approx(backbone, abs=1e-6)
    assert seen[False][:: len(opt.param_groups) - n] == pytest.approx(head, abs=1e-6)
