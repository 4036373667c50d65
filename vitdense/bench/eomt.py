"""`eomt-peer`: vitdense's EoMT against transformers' `EomtForUniversalSegmentation`, the
same weights, inference on the CPU.

transformers is not a dependency of vitdense: the command says how to install it when it is
missing. Both models get the same random weights (vitdense's initialisation, copied into
transformers' names by `transformers_state_dict`, the key map of transformers'
`convert_eomt_to_hf.py` applied to vitdense's names) and the same normalised images, and
compute the same thing: masked attention in every joined block (`attn_mask_probs` 1), a
prediction before each joined block and after the last; the printed difference of their
mask logits says so.
"""

from __future__ import annotations

import argparse
import re
import sys

import torch
from torch import nn

from vitdense.bench.common import alternating_rounds, cpu_kind

#: vitdense's names -> transformers' (EomtForUniversalSegmentation), first match wins
_RENAMES = (
    (r"backbone\.cls_token", "embeddings.cls_token"),
    (r"backbone\.reg_token", "embeddings.register_tokens"),
    (r"backbone\.pos_embed", "embeddings.position_embeddings.weight"),
    (r"backbone\.patch_embed\.proj\.", "embeddings.patch_embeddings.projection."),
    (r"backbone\.blocks\.(\d+)\.attn\.proj\.", r"layers.\1.attention.out_proj."),
    (r"backbone\.blocks\.(\d+)\.ls(\d)\.gamma", r"layers.\1.layer_scale\2.lambda1"),
    (r"backbone\.blocks\.(\d+)\.", r"layers.\1."),
    (r"backbone\.norm\.", "layernorm."),
    (r"head\.q\.weight", "query.weight"),
    (r"head\.class_head\.", "class_predictor."),
    (r"head\.mask_head\.0\.", "mask_head.fc1."),
    (r"head\.mask_head\.2\.", "mask_head.fc2."),
    (r"head\.mask_head\.4\.", "mask_head.fc3."),
    (r"head\.upscale\.(\d+)\.norm\.", r"upscale_block.block.\1.layernorm2d."),
    (r"head\.upscale\.(\d+)\.", r"upscale_block.block.\1."),
    (r"head\.attn_mask_probs", "attn_mask_probs"),
)


def transformers_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' `EomtForUniversalSegmentation` tensors from vitdense's `EoMT` state dict
    (DINOv2-like backbones: class token, registers, position embeddings on the patches only,
    LayerScale). timm's fused qkv projection is split into q, k and v; transformers' loss
    weight (`criterion.empty_weight`) is not a model tensor and stays the model's own."""
    out = {}
    for key, tensor in state.items():
        for pattern, replacement in _RENAMES:
            if re.match(pattern, key):
                name = re.sub(pattern, replacement, key, count=1)
                break
        else:
            raise KeyError(f"{key}: no transformers EoMT tensor for it")
        if name.endswith(("attn.qkv.weight", "attn.qkv.bias")):
            prefix, kind = name.rsplit(".attn.qkv.", 1)
            for part, chunk in zip("qkv", tensor.chunk(3), strict=True):
                out[f"{prefix}.attention.{part}_proj.{kind}"] = chunk
        elif name == "embeddings.position_embeddings.weight":
            out[name] = tensor[0]  # [1, N, D] -> nn.Embedding's [N, D]
        else:
            out[name] = tensor
    return out


def build_pair(args: argparse.Namespace) -> tuple[nn.Module, nn.Module]:
    """vitdense's EoMT (DINOv2-like ViT of `args`' size, random weights) and transformers'
    with the same weights, both in evaluation with masks in every joined block."""
    from transformers import EomtConfig, EomtForUniversalSegmentation

    from vitdense.backbone import VisionTransformer
    from vitdense.heads.eomt import EoMTHead
    from vitdense.models.universal import EoMT

    torch.manual_seed(0)
    backbone = VisionTransformer(
        img_size=args.img_size,
        patch_size=args.patch_size,
        embed_dim=args.embed_dim,
        depth=args.depth,
        num_heads=args.num_heads,
        init_values=1.0,  # transformers' layers always scale their branches
        reg_tokens=args.reg_tokens,
        no_embed_class=True,
    )
    head = EoMTHead(args.embed_dim, args.num_classes, args.patch_size, args.num_queries, args.num_blocks)
    ours = EoMT(backbone, head).eval()
    config = EomtConfig(
        hidden_size=args.embed_dim,
        num_hidden_layers=args.depth,
        num_attention_heads=args.num_heads,
        image_size=args.img_size,
        patch_size=args.patch_size,
        num_upscale_blocks=len(head.upscale),
        num_blocks=args.num_blocks,
        num_queries=args.num_queries,
        num_register_tokens=args.reg_tokens,
        num_labels=args.num_classes,
    )
    peer = EomtForUniversalSegmentation(config).eval()
    weights = transformers_state_dict(ours.state_dict())
    weights["criterion.empty_weight"] = peer.state_dict()["criterion.empty_weight"]
    peer.load_state_dict(weights, strict=True)
    return ours, peer


def bench_eomt_peer(args: argparse.Namespace) -> dict[str, float]:
    """Median ms of an inference step (fp32, inference mode) of each model, alternating them
    every round, and the largest difference of their mask logits."""
    import transformers

    ours, peer = build_pair(args)
    x = torch.randn(args.batch_size, 3, args.img_size, args.img_size)
    steps = {"vitdense": lambda: ours(x).mask_logits, "transformers": lambda: peer(pixel_values=x).masks_queries_logits}
    with torch.inference_mode():
        diff = (steps["vitdense"]() - steps["transformers"]()).abs().max().item()
        timed = alternating_rounds(steps, args.iters, args.warmup)
    results: dict = {name: wall for name, (wall, _) in timed.items()}
    results["max_diff"] = diff
    results["attn"] = peer.config._attn_implementation
    results["version"] = transformers.__version__
    return results


def transformers_missing() -> str | None:
    """How to install transformers when it cannot be imported, else None."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return (
            "eomt-peer compares with transformers' EomtForUniversalSegmentation, and transformers is not installed "
            "(it is not a vitdense dependency): pip install transformers (measured with 5.24), or into a folder of its own: "
            "pip install --target DIR transformers, then PYTHONPATH=DIR"
        )
    return None


def run_eomt_peer(args: argparse.Namespace) -> None:
    if (message := transformers_missing()) is not None:
        print(f"vitdense.bench: error: {message}", file=sys.stderr)
        raise SystemExit(2)
    print_eomt_peer(args, bench_eomt_peer(args))


def print_eomt_peer(args: argparse.Namespace, results: dict) -> None:
    b = args.batch_size
    print(
        f"EoMT, ViT {args.embed_dim}x{args.depth} ({args.num_heads} heads, patch {args.patch_size}, "
        f"{args.reg_tokens} registers), {args.num_queries} queries in the last {args.num_blocks} blocks, "
        f"{args.num_classes} classes, {args.img_size} x {args.img_size}, batch {b}, fp32 inference on {cpu_kind()} "
        f"({torch.get_num_threads()} threads, torch {torch.__version__}, transformers {results['version']} "
        f"attn_implementation={results['attn']}), median of {args.iters} alternating rounds"
    )
    print(f"{'':24}{'ms/batch':>12}{'img/s':>10}")
    for name in ("vitdense", "transformers"):
        print(f"{name:24}{results[name]:12.1f}{1000 * b / results[name]:10.2f}")
    ours, peer = results["vitdense"], results["transformers"]
    print(f"{'vitdense / transformers':24}{ours / peer:12.3f}{peer / ours:10.3f}")
    print(f"mask logits: max |vitdense - transformers| = {results['max_diff']:.2e}")
