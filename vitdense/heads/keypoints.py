"""Keypoints on a query-based detector: every object query predicts, beside its class and box,
its object's K keypoints (`KeypointHead`), relative to its own box as RF-DETR's keypoint
head places them (x = cx + dx w, y = cy + dy h). A detection head with `num_keypoints > 0`
(`DETRHead`, `LWDETRHead`) runs it on every decoder layer's queries; its 7 numbers per
keypoint are those RF-DETR's keypoint loss reads (`vitdense.losses.keypoints`).

RF-DETR's preview also gives each keypoint a query of its own in the decoder (GroupPose's
keypoint queries); here the object's query predicts all K from its state, the head DETR
keypoint baselines use, which any decoder can carry.
"""

from __future__ import annotations

import torch
from torch import nn
from torchvision.ops import MLP

from vitdense.types.keypoints import KEYPOINT_CHANNELS


class KeypointHead(nn.Module):
    """An MLP from a query's decoder state to its K keypoints, placed relative to its box.

    Starts (zero last layer, as RF-DETR's keypoint head) with every keypoint at its box's
    centre, findable and visible probabilities 1/2 and the identity precision factor.

    Args:
        hidden_dim: decoder width d.
        num_keypoints: K.
        num_layers: MLP depth (DETR's box head's: 3).
    """

    def __init__(self, hidden_dim: int, num_keypoints: int, num_layers: int = 3) -> None:
        super().__init__()
        if num_keypoints < 1:
            raise ValueError(f"KeypointHead: num_keypoints={num_keypoints}; expected at least 1")
        self.num_keypoints = num_keypoints
        self.mlp = MLP(hidden_dim, [hidden_dim] * (num_layers - 1) + [num_keypoints * KEYPOINT_CHANNELS])
        last = [m for m in self.mlp if isinstance(m, nn.Linear)][-1]
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)

    def forward(self, hidden: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """hidden [..., d] decoder states, boxes [..., 4] their predicted (cx, cy, w, h) ->
        [..., K, 7]: (x, y) in [0, 1] of the unpadded image, findable and visible logits,
        log l11, l21, log l22; in fp32 under any autocast (as the box path: a bf16 step is
        2^-8 of the image near its far side).

        The box is detached: keypoints learn where they are within it, and the box learns
        from its own loss only (a keypoint error does not move the box)."""
        with torch.autocast(hidden.device.type, enabled=False):
            out = self.mlp(hidden.float()).unflatten(-1, (self.num_keypoints, KEYPOINT_CHANNELS))
            box = boxes.detach().float()[..., None, :]
            xy = out[..., :2] * box[..., 2:] + box[..., :2]
            return torch.cat([xy, out[..., 2:]], -1)
