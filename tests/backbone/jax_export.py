"""Write a timm ViT's weights in the layout of google-research/vision_transformer `.npz`.

The inverse of timm's `_load_weights` for the original (non big_vision) layout. Tests use it
to make the JAX files we cannot download: if it were wrong, the weights timm reads back
would differ from the model's and the parity test comparing the two would fail.
"""

from pathlib import Path

import numpy as np
from torch import nn


def export_npz(model: nn.Module, path: Path) -> None:
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    d = model.embed_dim
    heads = model.blocks[0].attn.num_heads
    w = {
        "embedding/kernel": sd["patch_embed.proj.weight"].transpose(2, 3, 1, 0),
        "embedding/bias": sd["patch_embed.proj.bias"],
        "cls": sd["cls_token"],
        "Transformer/posembed_input/pos_embedding": sd["pos_embed"],
        "Transformer/encoder_norm/scale": sd["norm.weight"],
        "Transformer/encoder_norm/bias": sd["norm.bias"],
    }
    for i in range(len(model.blocks)):
        src, dst = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        mha = dst + "MultiHeadDotProductAttention_1/"
        qkv_w, qkv_b = np.split(sd[src + "attn.qkv.weight"], 3), np.split(sd[src + "attn.qkv.bias"], 3)
        for name, wt, b in zip(("query", "key", "value"), qkv_w, qkv_b, strict=True):
            w[mha + f"{name}/kernel"] = wt.T.reshape(d, heads, d // heads)
            w[mha + f"{name}/bias"] = b.reshape(heads, d // heads)
        w[mha + "out/kernel"] = sd[src + "attn.proj.weight"].T.reshape(heads, d // heads, d)
        w[mha + "out/bias"] = sd[src + "attn.proj.bias"]
        for ln, norm in (("LayerNorm_0", "norm1"), ("LayerNorm_2", "norm2")):
            w[dst + f"{ln}/scale"] = sd[src + f"{norm}.weight"]
            w[dst + f"{ln}/bias"] = sd[src + f"{norm}.bias"]
        for r in range(2):
            w[dst + f"MlpBlock_3/Dense_{r}/kernel"] = sd[src + f"mlp.fc{r + 1}.weight"].T
            w[dst + f"MlpBlock_3/Dense_{r}/bias"] = sd[src + f"mlp.fc{r + 1}.bias"]
    np.savez(path, **w)
