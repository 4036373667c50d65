"""DPT's dense prediction head (Ranftl et al., "Vision Transformers for Dense Prediction",
ICCV 2021), as its monocular depth model `DPTDepthModel` builds it.

Four blocks' outputs (`hooks`) are reassembled into maps at 1/4, 1/8, 1/16 and 1/32 of the
input (for a stride-16 ViT): the class token is read out (ignored, added or projected with
each patch token), the tokens are laid out on the patch grid, projected by a 1x1 convolution
and resampled (4x4 / 2x2 transposed convolution up, as is, strided 3x3 convolution down).
RefineNet-style fusion blocks merge them coarse to fine, each upsampling by 2 (bilinear,
`align_corners=True` as DPT), and the depth head (3x3 convolution, 2x upsampling, 3x3
convolution, ReLU, 1x1 convolution, ReLU for non-negative outputs) predicts at 16 times the
patch grid: the input resolution for a patch-16 ViT. DPT-Hybrid (R50+ViT-B/16) takes its
1/4 and 1/8 maps from the ResNet stem's first two stages instead (`stage_maps=2`).

Parameter names are DPT's own (isl-org/DPT: `pretrained.act_postprocess1.3`,
`scratch.refinenet4.resConfUnit2.conv1`, `scratch.output_conv.0`), so the head part of a DPT
checkpoint loads as is (`split_dpt_checkpoint`); transformers' `DPTForDepthEstimation`
weights are renamed by `dpt_state_dict_from_transformers`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from vitdense.backbone import ViTFeatures
from vitdense.heads.pyramid import zero_padding

Readout = Literal["ignore", "add", "project"]


class ReadoutProject(nn.Module):
    """DPT's `ProjectReadout`: every patch token concatenated with the class token, then a
    linear layer (2D -> D) and GELU: [B, N, D] -> [B, N, D]."""

    def __init__(self, embed_dim: int) -> None:
        super().__init__()
        self.project = nn.Sequential(nn.Linear(2 * embed_dim, embed_dim), nn.GELU())

    def forward(self, patches: torch.Tensor, cls_token: torch.Tensor) -> torch.Tensor:
        return self.project(torch.cat([patches, cls_token[:, None].expand_as(patches)], -1))


class Reassemble(nn.Sequential):
    """One reassemble stage: block output [B, P + h*w, D] -> map [B, C, s*h, s*w].

    A Sequential only so that the parameter names are DPT's `act_postprocessN.{0,3,4}`:
    0 the readout, 1 and 2 DPT's Transpose and Unflatten (done in `forward`), 3 the 1x1
    projection, 4 the resampling (absent at 1/16, as in DPT).
    """

    def __init__(self, embed_dim: int, channels: int, scale: float, readout: Readout) -> None:
        layers: list[nn.Module] = [
            ReadoutProject(embed_dim) if readout == "project" else nn.Identity(),
            nn.Identity(),
            nn.Identity(),
            nn.Conv2d(embed_dim, channels, 1),
        ]
        if scale == 4.0:
            layers.append(nn.ConvTranspose2d(channels, channels, 4, 4))
        elif scale == 2.0:
            layers.append(nn.ConvTranspose2d(channels, channels, 2, 2))
        elif scale == 0.5:
            layers.append(nn.Conv2d(channels, channels, 3, 2, 1))
        super().__init__(*layers)
        self.readout = readout

    def forward(self, tokens: torch.Tensor, features: ViTFeatures) -> torch.Tensor:  # type: ignore[override]
        p = features.prefix_tokens.shape[1]
        patches = tokens[:, p:]
        if self.readout == "project":
            patches = self[0](patches, tokens[:, 0])
        elif self.readout == "add":
            patches = patches + tokens[:, :1]
        b, _, d = patches.shape
        # padding tokens zeroed (the readout made them non-zero), as the zero border an image alone gets
        x = zero_padding(patches.transpose(1, 2).reshape(b, d, *features.grid_size), features.image_sizes)
        for layer in list(self)[3:]:
            x = layer(x)
        return x


class ResidualConvUnit(nn.Module):
    """DPT's `ResidualConvUnit_custom` without batch norm: x + conv(relu(conv(relu(x))))."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(features, features, 3, padding=1)
        self.conv2 = nn.Conv2d(features, features, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(F.relu(self.conv1(F.relu(x))))


class FeatureFusionBlock(nn.Module):
    """DPT's `FeatureFusionBlock_custom` (no batch norm, no expansion): the coarser path plus
    the residual unit of the skip map, a second residual unit, bilinear upsampling
    (`align_corners=True`), a 1x1 convolution.

    The deepest block (`refinenet4`) receives no skip map: its `resConfUnit1` exists (DPT's
    checkpoints hold it) but is never used.
    """

    def __init__(self, features: int) -> None:
        super().__init__()
        self.out_conv = nn.Conv2d(features, features, 1)
        self.resConfUnit1 = ResidualConvUnit(features)
        self.resConfUnit2 = ResidualConvUnit(features)

    def forward(
        self, x: torch.Tensor, skip: torch.Tensor | None = None, size: tuple[int, int] | None = None
    ) -> torch.Tensor:
        """x [B, F, h, w] (+ skip, same shape) -> [B, F, *size] (default 2h x 2w).

        DPT upsamples by exactly 2, which breaks when a grid side is odd (the 1/32 map has
        ceil(h / 2) rows); upsampling to the next skip map's size is the same for even sides
        (with `align_corners=True` the sampling grid depends only on the two sizes)."""
        if skip is not None:
            x = x + self.resConfUnit1(skip)
        x = self.resConfUnit2(x)
        size = size or (2 * x.shape[-2], 2 * x.shape[-1])
        return self.out_conv(F.interpolate(x, size=size, mode="bilinear", align_corners=True))


class Upsample2x(nn.Module):
    """DPT's `Interpolate(scale_factor=2, mode="bilinear", align_corners=True)`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)


def dpt_hooks(depth: int, stage_maps: int = 0) -> tuple[int, int, int, int]:
    """The four maps DPT reads from a backbone of `depth` blocks: its choices for ViT-B
    (12: 2, 5, 8, 11) and ViT-L (24: 5, 11, 17, 23) are the last block of each quarter; other
    depths by the same rule (4: 0, 1, 2, 3). With `stage_maps` k, the first k are the hybrid
    CNN's stages 0..k-1 instead (DPT-Hybrid, k = 2: 0, 1, 8, 11)."""
    if depth < 4:
        raise ValueError(f"DPT reads four blocks, and the backbone has {depth}: use at least 4 blocks")
    blocks = tuple(round(depth * k / 4) - 1 for k in (1, 2, 3, 4))
    return (*range(stage_maps), *blocks[stage_maps:])  # type: ignore[return-value]


class DPTHead(nn.Module):
    """DPT's reassemble, fusion and depth head over four blocks of a ViT, or (DPT-Hybrid)
    over two stages of its hybrid CNN and two blocks.

    The model passes `block_hooks` to the backbone as `intermediates` (raw block outputs, not
    normalised, as DPT's forward hooks read them) and `stage_hooks` as `stem_stages`.

    DPT-Hybrid (`stage_maps=2`, hooks (0, 1, 8, 11), out_channels (256, 512, 768, 768)):
    the 1/4 and 1/8 maps are the outputs of stages 0 and 1 of the ResNet-50 stem (256 and 512
    channels at strides 4 and 8), taken as they are (DPT's `act_postprocess1` and `2` are
    identities: no readout, projection or resampling, and no parameters); the 1/16 and 1/32
    maps are reassembled from blocks 8 and 11 as in the plain model.

    Args:
        embed_dim: D of the backbone.
        num_outputs: output channels (DPT's depth model: 1).
        features: width of the fusion path (DPT: 256).
        hooks: the four blocks read (DPT: (2, 5, 8, 11) for ViT-B/16, (5, 11, 17, 23) for
            ViT-L/16); negative indices count from the end, as the backbone's. None: DPT's
            rule for the backbone's `depth` (`dpt_hooks`; `DepthTask` sets it from its
            backbone when no hooks are given), ViT-B's without one.
        readout: the class token's use: "ignore" (dropped), "add" (added to every patch token)
            or "project" (concatenated and projected, DPT's default). DPT's distilled-DeiT
            variant averages class and distillation tokens for "add"; here the readout is
            always the first prefix token (the class token).
        out_channels: channels of the 1/4, 1/8, 1/16, 1/32 maps (DPT ViT-B: (96, 192, 384,
            768); ViT-L: (256, 512, 1024, 1024)).
        non_negative: ReLU on the output (DPT's inverse depth is non-negative).
        depth: the backbone's depth, if known: `hooks` are then checked against it here.
        stage_maps: how many of the four maps (the finest first) are the hybrid CNN's stage
            outputs, `hooks` then naming stages for them: 0 (plain ViT) or DPT-Hybrid's 2.

    Padding: DPT has none (it resizes every image to one size). A padded batch runs, with
    padding tokens zeroed after the readout, but a padded image's prediction is not what it
    gives alone: every convolution sees the padding and, with `align_corners=True`, the
    bilinear sampling positions depend on the padded size, so even the image's interior
    moves. Train and predict on unpadded batches (one size per batch) for DPT's behaviour.
    """

    def __init__(
        self,
        embed_dim: int,
        num_outputs: int = 1,
        features: int = 256,
        hooks: Sequence[int] | None = None,
        readout: Readout = "project",
        out_channels: Sequence[int] = (96, 192, 384, 768),
        non_negative: bool = True,
        depth: int | None = None,
        stage_maps: int = 0,
    ) -> None:
        super().__init__()
        if stage_maps not in (0, 1, 2):
            raise ValueError(
                f"DPTHead: stage_maps={stage_maps}; 0 (plain ViT) or DPT-Hybrid's 2 (at most the 1/4 and 1/8 maps)"
            )
        #: whether the blocks were chosen (False: DPT's rule, which a task may re-apply for its backbone)
        self.hooks_given = hooks is not None
        self.stage_maps = stage_maps
        hooks = hooks if hooks is not None else dpt_hooks(depth or 12, stage_maps)
        if len(hooks) != 4 or len(out_channels) != 4:
            raise ValueError(
                f"DPTHead: hooks={tuple(hooks)} and out_channels={tuple(out_channels)} need 4 entries each "
                "(the 1/4, 1/8, 1/16 and 1/32 maps)"
            )
        if readout not in ("ignore", "add", "project"):
            raise ValueError(f"DPTHead: readout={readout!r}; expected 'ignore', 'add' or 'project'")
        if depth is not None and (bad := [i for i in hooks[stage_maps:] if not -depth <= i < depth]):
            raise ValueError(f"DPTHead: hooks {bad} are out of range for a backbone of depth {depth}")
        self.hooks = tuple(int(i) for i in hooks)
        self.readout = readout
        self.num_outputs = num_outputs
        # DPT's module tree: `pretrained` (its backbone wrapper: here only the reassemble
        # stages) and `scratch` (projections, fusion blocks, output head)
        self.pretrained = nn.Module()
        for i, (channels, scale) in enumerate(zip(out_channels, (4.0, 2.0, 1.0, 0.5), strict=True), 1):
            # a CNN stage's map is used as it is (DPT-Hybrid's act_postprocess1/2: identities, no parameters)
            stage = nn.Identity() if i <= stage_maps else Reassemble(embed_dim, channels, scale, readout)
            setattr(self.pretrained, f"act_postprocess{i}", stage)
        self.scratch = nn.Module()
        for i, channels in enumerate(out_channels, 1):
            setattr(self.scratch, f"layer{i}_rn", nn.Conv2d(channels, features, 3, padding=1, bias=False))
        for i in range(1, 5):
            setattr(self.scratch, f"refinenet{i}", FeatureFusionBlock(features))
        self.scratch.output_conv = nn.Sequential(
            nn.Conv2d(features, features // 2, 3, padding=1),
            Upsample2x(),
            nn.Conv2d(features // 2, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, num_outputs, 1),
            nn.ReLU() if non_negative else nn.Identity(),
        )

    def start_output_at(self, value: float) -> None:
        """Start the untrained head at `value` everywhere: the output convolution's bias set to it.

        From scratch, PyTorch's default initialisation of that 1x1 convolution over its
        non-negative (ReLU) inputs gives an output of one sign over the whole image, and for
        about half the seeds (9 of 20 for the depth demo's head) that sign is negative: the
        final ReLU (`non_negative`) then outputs 0 at every pixel and passes no gradient, and
        the head never learns. A positive start keeps it alive (the weights stay random, so
        pixels still differ)."""
        with torch.no_grad():
            self.scratch.output_conv[4].bias.fill_(value)

    @property
    def stage_hooks(self) -> tuple[int, ...]:
        """The hybrid CNN's stages read (the backbone's `stem_stages`): the first `stage_maps` hooks."""
        return self.hooks[: self.stage_maps]

    @property
    def block_hooks(self) -> tuple[int, ...]:
        """The blocks read (the backbone's `intermediates`): the other hooks."""
        return self.hooks[self.stage_maps :]

    def forward(self, features: ViTFeatures) -> torch.Tensor:
        """ViTFeatures with the intermediates of `block_hooks` (and the stem features of
        `stage_hooks`) -> [B, num_outputs, 16 h, 16 w] for the patch grid (h, w): the input
        size for a patch-16 ViT (inputs whose sides are multiples of 16)."""
        if len(features.intermediates) != 4 - self.stage_maps or len(features.stem_features) != self.stage_maps:
            raise ValueError(
                f"DPTHead reads blocks {self.block_hooks} and CNN stages {self.stage_hooks} but got "
                f"{len(features.intermediates)} intermediates and {len(features.stem_features)} stem features: call "
                "the backbone with intermediates=head.block_hooks, stem_stages=head.stage_hooks"
            )
        if self.readout != "ignore" and features.prefix_tokens.shape[1] == 0:
            raise ValueError(f"DPTHead(readout={self.readout!r}) needs a class token; use readout='ignore'")
        pre, s = self.pretrained, self.scratch
        stages = (pre.act_postprocess1, pre.act_postprocess2, pre.act_postprocess3, pre.act_postprocess4)
        maps = list(features.stem_features) + [
            stage(tokens, features)
            for stage, tokens in zip(stages[self.stage_maps :], features.intermediates, strict=True)
        ]
        l1, l2, l3, l4 = (
            rn(m) for rn, m in zip((s.layer1_rn, s.layer2_rn, s.layer3_rn, s.layer4_rn), maps, strict=True)
        )
        path = s.refinenet4(l4, size=l3.shape[-2:])
        path = s.refinenet3(path, l3, size=l2.shape[-2:])
        path = s.refinenet2(path, l2, size=l1.shape[-2:])
        path = s.refinenet1(path, l1)
        return s.output_conv(path)


def split_dpt_checkpoint(state_dict: Mapping[str, torch.Tensor]) -> tuple[dict, dict]:
    """An isl-org/DPT `DPTDepthModel` state dict -> (backbone state dict in timm's names, for
    `VisionTransformer`; `DPTHead` state dict)."""
    prefix = "pretrained.model."
    backbone = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
    head = {k: v for k, v in state_dict.items() if not k.startswith(prefix)}
    return backbone, head


_HF_BLOCK = {
    "attention.output.dense": "attn.proj",
    "intermediate.dense": "mlp.fc1",
    "output.dense": "mlp.fc2",
    "layernorm_before": "norm1",
    "layernorm_after": "norm2",
}
_HF_FUSION = {
    "projection": "out_conv",
    "residual_layer1.convolution1": "resConfUnit1.conv1",
    "residual_layer1.convolution2": "resConfUnit1.conv2",
    "residual_layer2.convolution1": "resConfUnit2.conv1",
    "residual_layer2.convolution2": "resConfUnit2.conv2",
}


def dpt_state_dict_from_transformers(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' `DPTForDepthEstimation` (plain ViT, no hybrid, no batch norm) state dict
    -> isl-org/DPT's names (backbone under `pretrained.model.` in timm's names, query / key /
    value concatenated into `qkv`); split it with `split_dpt_checkpoint`.

    transformers orders its fusion layers deepest first (`fusion_stage.layers.0` is DPT's
    `refinenet4`)."""
    out: dict[str, torch.Tensor] = {}
    qkv: dict[str, dict[str, torch.Tensor]] = {}
    simple = {
        "dpt.embeddings.cls_token": "pretrained.model.cls_token",
        "dpt.embeddings.position_embeddings": "pretrained.model.pos_embed",
        "dpt.layernorm.weight": "pretrained.model.norm.weight",
        "dpt.layernorm.bias": "pretrained.model.norm.bias",
    }
    for key, value in state_dict.items():
        parts = key.split(".")
        if key in simple:
            out[simple[key]] = value
        elif key.startswith("dpt.embeddings.patch_embeddings.projection."):
            out[f"pretrained.model.patch_embed.proj.{parts[-1]}"] = value
        elif key.startswith("dpt.encoder.layer."):
            i, rest = parts[3], ".".join(parts[4:-1])
            if rest.startswith("attention.attention."):  # query / key / value
                qkv.setdefault(f"pretrained.model.blocks.{i}.attn.qkv.{parts[-1]}", {})[parts[-2]] = value
            elif rest in _HF_BLOCK:
                out[f"pretrained.model.blocks.{i}.{_HF_BLOCK[rest]}.{parts[-1]}"] = value
            else:
                raise KeyError(f"transformers DPT weight {key!r} has no counterpart in DPT")
        elif key.startswith("neck.reassemble_stage.readout_projects."):
            out[f"pretrained.act_postprocess{int(parts[3]) + 1}.0.project.0.{parts[-1]}"] = value
        elif key.startswith("neck.reassemble_stage.layers."):
            index = {"projection": 3, "resize": 4}[parts[4]]
            out[f"pretrained.act_postprocess{int(parts[3]) + 1}.{index}.{parts[-1]}"] = value
        elif key.startswith("neck.convs."):
            out[f"scratch.layer{int(parts[2]) + 1}_rn.{parts[-1]}"] = value
        elif key.startswith("neck.fusion_stage.layers."):
            rest = ".".join(parts[4:-1])
            out[f"scratch.refinenet{4 - int(parts[3])}.{_HF_FUSION[rest]}.{parts[-1]}"] = value
        elif key.startswith("head.head."):
            out[f"scratch.output_conv.{parts[2]}.{parts[-1]}"] = value
        elif key.startswith("dpt.pooler."):
            continue  # not part of the depth model
        else:
            raise KeyError(f"transformers DPT weight {key!r} has no counterpart in DPT (hybrid or batch-norm model?)")
    for key, parts_ in qkv.items():
        out[key] = torch.cat([parts_["query"], parts_["key"], parts_["value"]])
    return out
