"""Build a backbone from a timm model name and load timm or JAX weights into it.

The architecture comes from timm itself: we build timm's model for the name on the meta
device (no memory, no weights), read its shape, and refuse anything outside the plain ViT
family with a message that says which feature is missing. Weights go through timm's own
converters (`checkpoint_filter_fn` for PyTorch files, `load_pretrained` for the original
`.npz` files), so whatever timm can load, we load, to the number.
"""

from __future__ import annotations

import difflib
import functools
import logging
from pathlib import Path
from typing import Any

import timm
import torch
from timm.layers import LayerScale, Mlp, StdConv2dSame
from timm.layers import PatchEmbed as TimmPatchEmbed
from timm.layers.hybrid_embed import HybridEmbed as TimmHybridEmbed
from timm.models.eva import Eva
from timm.models.eva import checkpoint_filter_fn as eva_checkpoint_filter_fn
from timm.models.resnetv2 import ResNetV2
from timm.models.vision_transformer import Block as TimmBlock
from timm.models.vision_transformer import VisionTransformer as TimmVisionTransformer
from timm.models.vision_transformer import checkpoint_filter_fn
from torch import nn

from vitdense.backbone.attention import AttnImpl
from vitdense.backbone.eva import EvaBlock, eva_arch_from_timm
from vitdense.backbone.hybrid import HybridEmbed
from vitdense.backbone.vit import VisionTransformer
from vitdense.core.errors import CheckpointError, ConfigError
from vitdense.core.safe_load import torch_load

_logger = logging.getLogger(__name__)

#: tensors of timm checkpoints that belong to classification heads, not to the encoder
HEAD_PREFIXES = ("head.", "head_dist.", "pre_logits.", "fc_norm.", "attn_pool.")
TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")
#: `model_args` that configure vitdense's windowed attention rather than timm's architecture
WINDOW_ARGS = ("window_size", "num_windows", "global_attn_indexes")


def check_model_name(model_name: str) -> None:
    """Raise ValueError, with the closest ViT names, when timm has no such architecture."""
    arch, _ = timm.models.split_model_name_tag(model_name)
    if arch not in timm.list_models():
        candidates = timm.list_models("*vit*") + timm.list_models("deit*")
        close = difflib.get_close_matches(arch, candidates, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else " See timm.list_models('vit_*')."
        raise ConfigError(f"unknown model name {model_name!r}.{hint}")


def _timm_reference(
    model_name: str,
    img_size: int | tuple[int, int] | None,
    device: str = "meta",
    model_args: dict[str, Any] | None = None,
) -> nn.Module:
    """timm's model for `model_name` without a head, on `device` ("meta": shapes only).

    `model_args` are timm's architecture overrides (`depth`, `patch_size`, `embed_dim`, ...),
    passed to `timm.create_model` as timm's own `--model-kwargs` are.
    """
    check_model_name(model_name)
    kwargs = dict(model_args or {})
    if img_size is not None:
        kwargs["img_size"] = img_size
    if is_eva(model_name):
        # RoPE modules without a cached grid: vitdense asks them for every image's own grid
        kwargs.setdefault("dynamic_img_size", True)
    with torch.device(device):
        try:
            return timm.create_model(model_name, pretrained=False, num_classes=0, **kwargs)
        except TypeError as err:  # an argument timm's constructor does not take
            raise ConfigError(f"model_args {model_args} for {model_name!r}: {err}") from err


def is_eva(model_name: str) -> bool:
    """Whether timm builds `model_name` as its `Eva` class (DINOv3, EVA-02, PE, RoPE-ViT)."""
    arch, _ = timm.models.split_model_name_tag(model_name)
    return timm.models.model_entrypoint(arch).__module__ == "timm.models.eva"


def arch_from_timm(ref: nn.Module, model_name: str) -> dict:
    """VisionTransformer constructor arguments that reproduce timm's `ref`.

    Raises ConfigError naming every feature of `ref` that vitdense's ViT and Eva families lack.
    """
    if isinstance(ref, Eva):
        arch = eva_arch_from_timm(ref, model_name)
        arch["block_fn"] = functools.partial(EvaBlock, **arch.pop("block_args"))
        return arch
    if not isinstance(ref, TimmVisionTransformer):
        raise ConfigError(f"{model_name!r} is a {type(ref).__name__}, not a plain Vision Transformer")
    unsupported = []
    block = ref.blocks[0]
    if ref.pos_embed is None:
        unsupported.append("no absolute position embedding")
    if not isinstance(ref.norm_pre, nn.Identity):
        unsupported.append("pre-encoder norm (norm_pre, CLIP-style)")
    if not isinstance(ref.fc_norm, nn.Identity) or not isinstance(ref.norm, nn.LayerNorm):
        unsupported.append("norm after pooling (fc_norm) instead of a final LayerNorm")
    if getattr(ref, "attn_pool", None) is not None:
        unsupported.append("attention pooling head")
    if type(block) is not TimmBlock:
        unsupported.append(f"{type(block).__name__} blocks")
    else:
        if not isinstance(block.attn.q_norm, nn.Identity) or not isinstance(
            getattr(block.attn, "norm", nn.Identity()), nn.Identity
        ):
            unsupported.append("normalised attention (qk_norm / scale_attn_norm)")
        if type(block.mlp) is not Mlp or not isinstance(block.mlp.norm, nn.Identity):
            unsupported.append(f"{type(block.mlp).__name__} MLP")
        elif type(block.mlp.act) is not nn.GELU or block.mlp.act.approximate != "none":
            unsupported.append(f"{block.mlp.act} activation")
        if not isinstance(block.norm1, nn.LayerNorm):
            unsupported.append(f"{type(block.norm1).__name__} norm")
    embed = ref.patch_embed
    patch_embed = None
    if isinstance(embed, TimmHybridEmbed):
        cnn = embed.backbone
        layers = tuple(len(s.blocks) for s in cnn.stages) if isinstance(cnn, ResNetV2) else ()
        stem_conv = cnn.stem.conv if isinstance(cnn, ResNetV2) else getattr(cnn, "conv", None)
        if not isinstance(stem_conv, StdConv2dSame):
            unsupported.append("hybrid CNN other than the JAX-style ResNetV2 with SAME padding")
        in_chans = embed.in_chans
        patch_embed = HybridEmbed(layers, embed.patch_size, in_chans, ref.embed_dim) if not unsupported else None
    elif type(embed) is TimmPatchEmbed:
        if not isinstance(embed.norm, nn.Identity) or embed.proj.bias is None:
            unsupported.append("patch embedding with a norm or without bias")
        in_chans = embed.proj.in_channels
    else:
        unsupported.append(f"{type(embed).__name__} patch embedding")
    if unsupported:
        raise ConfigError(f"{model_name!r} is outside vitdense's plain ViT family: {'; '.join(unsupported)}")
    return dict(
        img_size=tuple(embed.img_size),
        patch_size=tuple(embed.patch_size),
        in_chans=in_chans,
        embed_dim=ref.embed_dim,
        depth=len(ref.blocks),
        num_heads=block.attn.num_heads,
        mlp_ratio=block.mlp.fc1.out_features / ref.embed_dim,
        qkv_bias=block.attn.qkv.bias is not None,
        init_values=block.ls1.init_values if isinstance(block.ls1, LayerScale) else None,
        class_token=ref.cls_token is not None,
        dist_token=getattr(ref, "dist_token", None) is not None,
        reg_tokens=ref.num_reg_tokens,
        no_embed_class=ref.no_embed_class,
        norm_eps=ref.norm.eps,
        patch_embed=patch_embed,
    )


def read_state_dict(path: str | Path, trust: bool = False) -> dict[str, torch.Tensor]:
    """Tensors of a `.safetensors`, `.pth`/`.pt`/`.bin`/`.ckpt` file (CPU).

    Torch files are unpickled without running code from them (`vitdense.core.safe_load`): tensors,
    plain values and what official checkpoints carry beside them (an `args` Namespace, numpy
    scalars). A file holding other objects raises `CheckpointError`, unless `trust` (a file the
    user trusts: it is then loaded in full, and may run code as it loads).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    suffix = path.suffix.lower()
    try:
        if suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        if suffix in TORCH_SUFFIXES:
            return torch_load(path, "checkpoint", trust=trust)
    except CheckpointError:
        raise
    except Exception as err:  # corrupt or truncated files raise many different types
        raise CheckpointError(f"cannot read checkpoint {path}: {err}") from err
    raise CheckpointError(
        f"checkpoint {path}: unknown format {suffix!r}; use .safetensors, {', '.join(TORCH_SUFFIXES)} or a JAX .npz"
    )


def _encoder_tensors(state_dict: dict) -> dict[str, torch.Tensor]:
    """Unwrap training checkpoints ({'model': ...}, {'state_dict': ...}) and strip a module
    prefix ('module.', 'backbone.', ...) found in front of `pos_embed`."""
    for key in ("model", "state_dict", "model_ema"):
        if isinstance(state_dict.get(key), dict):
            state_dict = state_dict[key]
            break
    anchor = next((k for k in ("pos_embed", "cls_token", "patch_embed.proj.weight") if k in state_dict), None)
    if anchor is None:
        prefixes = {
            k[: -len(a)] for a in ("pos_embed", "cls_token", "patch_embed.proj.weight") for k in state_dict
            if k.endswith("." + a)
        }  # fmt: skip
        if len(prefixes) == 1:
            (prefix,) = prefixes
            state_dict = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
    return state_dict


def load_weights(model: VisionTransformer, state_dict: dict[str, torch.Tensor], source: str) -> None:
    """Strictly load encoder tensors (timm names, already converted) into `model`.

    Classification heads are dropped (counted in the log); anything else that does not
    fit raises `CheckpointError` listing the missing, unexpected and mis-shaped keys.
    """
    heads = [k for k in state_dict if k.startswith(HEAD_PREFIXES)]
    tensors = {k: v for k, v in state_dict.items() if not k.startswith(HEAD_PREFIXES)}
    if heads:
        _logger.info("%s: dropped %d classification-head tensors (%s)", source, len(heads), ", ".join(heads))
    own = model.state_dict()
    missing = sorted(set(own) - set(tensors))
    unexpected = sorted(set(tensors) - set(own))
    mis_shaped = [
        f"{k}: checkpoint {tuple(tensors[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own
        if k in tensors and tensors[k].shape != own[k].shape
    ]
    if missing or unexpected or mis_shaped:
        problems = []
        for label, keys in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", mis_shaped)):
            if keys:
                shown = ", ".join(keys[:20]) + (f" ... (+{len(keys) - 20} more)" if len(keys) > 20 else "")
                problems.append(f"{label} ({len(keys)}): {shown}")
        raise CheckpointError(
            f"{source} does not fit this architecture; check the model name matches the weights.\n  "
            + "\n  ".join(problems)
        )
    model.load_state_dict(tensors)


def create_backbone(
    model_name: str,
    pretrained: bool = False,
    checkpoint: str | Path | None = None,
    img_size: int | tuple[int, int] | None = None,
    drop_rate: float = 0.0,
    attn_drop_rate: float = 0.0,
    drop_path_rate: float = 0.0,
    attn_impl: AttnImpl = "auto",
    model_args: dict[str, Any] | None = None,
    trust_checkpoint: bool = False,
) -> VisionTransformer:
    """A vitdense `VisionTransformer` with the architecture of timm's `model_name`.

    Args:
        model_name: a timm name, optionally with a pretrained tag
            ("vit_base_patch16_224.augreg_in21k"); the tag selects the normalisation and
            native size recorded in `backbone.pretrained_cfg`.
        pretrained: fetch the tag's weights from timm's hub (needs network).
        checkpoint: a local weight file instead: timm-format `.safetensors`, `.pth`, `.bin`,
            or an original google-research/vision_transformer `.npz`.
        img_size: native input size; position embeddings are resampled to its grid when
            loading. Defaults to the pretrained config's input size. Any other size still
            works at run time (the table is resampled per grid).
        drop_rate, attn_drop_rate, drop_path_rate, attn_impl: see `VisionTransformer`.
        model_args: timm architecture overrides, e.g. `{"depth": 6, "patch_size": 8}` for a
            smaller model trained from scratch; pretrained weights must still fit them. Also
            vitdense's windowed attention (`window_size` or `num_windows`, with
            `global_attn_indexes`; see `VisionTransformer`), which adds no weights.
        trust_checkpoint: load a torch `checkpoint` that holds Python objects beyond
            tensors and plain values in full (it may run code as it loads: only for a file
            you trust). Without it such a file raises `CheckpointError`; official
            checkpoints (DeiT's, MAE's `args` Namespace, numpy scalars) load without it.
    """
    if pretrained and checkpoint is not None:
        raise ConfigError("create_backbone: give either pretrained=True or checkpoint=..., not both")
    # windowed attention is vitdense's, not an architecture timm builds: no parameter of its own
    model_args = dict(model_args or {})
    windows = {k: model_args.pop(k) for k in WINDOW_ARGS if k in model_args}
    ref = _timm_reference(model_name, img_size, model_args=model_args)
    # a missing, unreadable or refused file fails before the random initialisation (seconds for a large model)
    is_npz = checkpoint is not None and Path(checkpoint).suffix.lower() == ".npz"
    tensors = read_state_dict(checkpoint, trust_checkpoint) if checkpoint is not None and not is_npz else None
    model = VisionTransformer(
        **arch_from_timm(ref, model_name),
        drop_rate=drop_rate,
        attn_drop_rate=attn_drop_rate,
        drop_path_rate=drop_path_rate,
        attn_impl=attn_impl,
        **windows,
    )
    model.pretrained_cfg = dict(ref.pretrained_cfg)
    if pretrained:
        try:
            timm_model = timm.create_model(
                model_name, pretrained=True, num_classes=0, img_size=model.img_size, **(model_args or {})
            )
        except Exception as err:
            raise RuntimeError(
                f"could not fetch pretrained weights for {model_name!r} ({err}). Offline? Download them "
                "where there is network and pass checkpoint='path/to/file'."
            ) from err
        load_weights(model, timm_model.state_dict(), f"timm pretrained {model_name}")
    elif checkpoint is not None:
        path = Path(checkpoint)
        if is_npz:
            if not path.is_file():
                raise FileNotFoundError(f"checkpoint {path} does not exist")
            # timm's converter for the JAX layouts (original ViT, big_vision, hybrids)
            timm_model = _timm_reference(model_name, model.img_size, device="cpu", model_args=model_args)
            timm_model.load_pretrained(str(path))
            state_dict = timm_model.state_dict()
        else:
            filter_fn = eva_checkpoint_filter_fn if isinstance(ref, Eva) else checkpoint_filter_fn
            state_dict = filter_fn(_encoder_tensors(tensors), ref)
        load_weights(model, state_dict, f"checkpoint {path}")
    return model
