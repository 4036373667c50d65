"""Image classification from the class token or from average-pooled patch tokens."""

from __future__ import annotations

from typing import Literal

import torch
from timm.layers import trunc_normal_
from torch import nn

from vitdense.backbone import ViTFeatures


def pool_tokens(features: ViTFeatures, pool: Literal["token", "avg"]) -> torch.Tensor:
    """[B, D] image representation: the class token, or the mean of the valid patch tokens."""
    if pool == "token":
        if features.cls_token is None:
            raise ValueError("pool='token' needs a backbone with a class token; use pool='avg'")
        return features.cls_token
    tokens = features.patch_tokens
    if not features.image_sizes.has_padding:
        return tokens.mean(dim=1)
    # padding tokens are zero: sum every token, divide by each image's own token count
    counts = torch.tensor([h * w for h, w in features.image_sizes.grids], device=tokens.device)
    return tokens.sum(1) / counts[:, None].to(tokens.dtype)


class ClassificationHead(nn.Module):
    """Dropout + linear classifier on a pooled representation (paper section 3.1 and 3.3).

    The classifier starts at zero when the backbone starts from pre-trained weights, as the
    paper does when fine-tuning ("we remove the pre-trained prediction head and attach a
    zero-initialized D x K layer"), and at timm's initialisation of a ViT trained from scratch
    otherwise: a zero head on a random backbone learns slower (issue 29: 73.4% instead of
    81.1% after 2 epochs from scratch). A task tells the head which case it is in through
    `init_for_backbone`; built alone, the head is in the from-scratch case.

    Args:
        embed_dim: D of the backbone.
        num_classes: K.
        pool: "token" (class token, the paper's default) or "avg" (global average pooling).
        drop_rate: dropout before the classifier.
        zero_init: None: follow the backbone (zero if it starts pre-trained, else timm's init);
            True / False: zero / timm's init whatever the backbone (checkpoints written before
            issue 29 record True and keep it).
    """

    def __init__(
        self,
        embed_dim: int,
        num_classes: int,
        pool: Literal["token", "avg"] = "token",
        drop_rate: float = 0.0,
        zero_init: bool | None = None,
    ) -> None:
        super().__init__()
        self.pool = pool
        self.zero_init = zero_init
        self.drop = nn.Dropout(drop_rate)
        self.fc = nn.Linear(embed_dim, num_classes)
        self._init_classifier(zero=bool(zero_init))

    def _init_classifier(self, zero: bool) -> None:
        if zero:
            nn.init.zeros_(self.fc.weight)
        else:
            # timm 1.0's VisionTransformer.init_weights (mode "", the default): its
            # init_weights_vit_timm gives every Linear, the head included, trunc_normal std .02
            trunc_normal_(self.fc.weight, std=0.02)
        nn.init.zeros_(self.fc.bias)

    def init_for_backbone(self, pretrained: bool) -> None:
        """Zero the classifier if the backbone starts from pre-trained weights (hub weights or a
        checkpoint file) and `zero_init` is None; an explicit `zero_init` already decided.
        Called by the task right after building the head (`BaseTask.configure_head`)."""
        if self.zero_init is None and pretrained:
            self._init_classifier(zero=True)

    def forward(self, features: ViTFeatures) -> torch.Tensor:
        """-> logits [B, K]."""
        return self.fc(self.drop(pool_tokens(features, self.pool)))


class DistilledClassificationHead(nn.Module):
    """DeiT's two classifiers (Touvron et al., ICML 2021, section 4): `head` on the class
    token, `head_dist` on the distillation token, as timm's `VisionTransformerDistilled`.

    The layers carry timm's names, so timm's `head.*` and `head_dist.*` tensors load into
    them unchanged (`load_timm_heads`). As timm's `distilled_training`: while training with
    `distilled_training` set, the head returns both logits (the task trains `head` on the
    labels and `head_dist` on the teacher); otherwise, and always in evaluation, it returns
    their mean, which is how DeiT predicts. Needs a backbone with a distillation token (a
    timm `deit_*_distilled_*` name): the task refuses any other.

    Args:
        embed_dim: D of the backbone.
        num_classes: K.
        drop_rate: dropout before both classifiers (timm's `head_drop`).
        zero_init: as `ClassificationHead` (None: zero on a pre-trained backbone, else timm's init).
    """

    def __init__(self, embed_dim: int, num_classes: int, drop_rate: float = 0.0, zero_init: bool | None = None) -> None:
        super().__init__()
        self.zero_init = zero_init
        self.distilled_training = False
        self.drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes)
        self.head_dist = nn.Linear(embed_dim, num_classes)
        self._init_classifier(zero=bool(zero_init))

    def _init_classifier(self, zero: bool) -> None:
        for fc in (self.head, self.head_dist):
            if zero:
                nn.init.zeros_(fc.weight)
            else:
                trunc_normal_(fc.weight, std=0.02)
            nn.init.zeros_(fc.bias)

    def init_for_backbone(self, pretrained: bool) -> None:
        """As `ClassificationHead.init_for_backbone`."""
        if self.zero_init is None and pretrained:
            self._init_classifier(zero=True)

    def set_distilled_training(self, enable: bool = True) -> None:
        """timm's name: return (logits, dist_logits) in training mode."""
        self.distilled_training = enable

    def load_timm_heads(self, state_dict: dict[str, torch.Tensor]) -> bool:
        """Copy timm's `head.*` and `head_dist.*` tensors when they fit (same K); returns
        whether they did (a checkpoint for other classes leaves the heads as initialised)."""
        tensors = {k: v for k, v in state_dict.items() if k.split(".")[0] in ("head", "head_dist")}
        own = self.state_dict()
        if set(tensors) != set(own) or any(tensors[k].shape != own[k].shape for k in own):
            return False
        self.load_state_dict(tensors)
        return True

    def forward_both(self, features: ViTFeatures) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (class-token logits [B, K], distillation-token logits [B, K])."""
        if features.cls_token is None or features.prefix_tokens.shape[1] < 2:
            raise ValueError("DistilledClassificationHead needs a backbone with class and distillation tokens")
        tokens = self.drop(features.prefix_tokens[:, :2])
        return self.head(tokens[:, 0]), self.head_dist(tokens[:, 1])

    def forward(self, features: ViTFeatures) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """-> logits [B, K] (the two heads' mean), or the pair while distilled training."""
        logits, dist_logits = self.forward_both(features)
        if self.distilled_training and self.training and not torch.jit.is_scripting():
            return logits, dist_logits
        return (logits + dist_logits) / 2
