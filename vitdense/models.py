"""The models themselves, without Lightning: a backbone, a head and the task's own pre- and
post-processing as plain `nn.Module`s that can be called on a tensor, scripted or exported.

Each task (`vitdense.tasks`) wraps one of these as `task.model` and adds the loss, the
metrics and the optimisation; a checkpoint's model is `vitdense.load_model(path)`.

    images [B, 3, H, W] (+ ImageSizes of a padded batch)
      ImageClassifier   -> logits [B, K]
      LinearProbe       -> logits of every probe head [H, B, K]
      Segmenter         -> pixel logits [B, K, H, W]; `segment` slides windows over whole images
      DETRDetector      -> DetectionOutput; `detect` -> boxes at each image's original size
      MaskedImageModel  -> MaskedImageOutput: a pre-training objective's predictions and targets
      EoMT              -> MaskClassOutput: class and mask logits per query (semantic, instance, panoptic)
      DPT               -> depth (or inverse depth) [B, 1, H, W]; `estimate` runs each size unpadded
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import box_convert

from vitdense.backbone import VisionTransformer
from vitdense.errors import ConfigError
from vitdense.heads.eomt import padding_valid
from vitdense.heads.linear_probe import probe_features
from vitdense.mask_inference import semantic_inference
from vitdense.sliding_windows import segment_batch
from vitdense.types import BoxTargets, DetectionOutput, ImageSizes, MaskClassOutput, Size, _ceil_div


class ImageClassifier(nn.Module):
    """backbone + classification head (e.g. `ClassificationHead`): images -> logits [B, K]."""

    def __init__(self, backbone: VisionTransformer, head: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, images: torch.Tensor, image_sizes: ImageSizes | None = None) -> torch.Tensor:
        """images [B, 3, H, W] (padded, with their `ImageSizes`) -> logits [B, K]."""
        return self.head(self.backbone(images, image_sizes))

    #: the names of `export_outputs`, in order (the graph's output names)
    export_names: ClassVar[tuple[str, ...]] = ("probs",)

    def export_outputs(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """What an exported graph returns for normalised images [B, 3, H, W]: probs [B, K]
        (softmax). Every model of this module declares its own (`vitdense.export`)."""
        return (self(images).softmax(-1),)


class LinearProbe(nn.Module):
    """A frozen backbone and linear heads on its class tokens (MAE's and DINOv2's probes).

    Args:
        backbone: the encoder; frozen and kept in evaluation mode here.
        heads: one or more heads from the probe features [B, F] to logits [B, K].
        n_last_blocks: class tokens of this many last blocks are concatenated (DINOv2: 4).
        avgpool: append the mean patch token of the last block (DINOv2's "avgpool").
    """

    def __init__(
        self, backbone: VisionTransformer, heads: nn.ModuleList, n_last_blocks: int = 1, avgpool: bool = False
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = heads
        self.n_last_blocks = n_last_blocks
        self.avgpool = avgpool
        backbone.freeze()
        backbone.eval()
        #: the head that validated best, the one that predicts; a buffer, so that checkpoints keep it
        self.register_buffer("best_head", torch.tensor(0), persistent=True)

    def train(self, mode: bool = True) -> LinearProbe:
        super().train(mode)
        self.backbone.eval()  # frozen means frozen: no dropout, no drop path
        return self

    @torch.no_grad()
    def extract(self, images: torch.Tensor, image_sizes: ImageSizes | None = None) -> torch.Tensor:
        """Probe input [B, F] from the frozen backbone."""
        return probe_features(self.backbone, images, image_sizes, self.n_last_blocks, self.avgpool)

    def classify(self, features: torch.Tensor) -> torch.Tensor:
        """[B, F] -> logits of every head [H, B, K]."""
        return torch.stack([head(features) for head in self.head])

    def forward(self, images: torch.Tensor, image_sizes: ImageSizes | None = None) -> torch.Tensor:
        """images [B, 3, H, W] -> logits of every head [H, B, K] (`best_head` picks one)."""
        return self.classify(self.extract(images, image_sizes))

    export_names: ClassVar[tuple[str, ...]] = ("probs",)

    def export_outputs(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """probs [B, K] of the head that validated best (`best_head`, picked by a tensor op:
        its value is data to torch.export, which cannot branch on it)."""
        return (self(images).index_select(0, self.best_head.view(1))[0].softmax(-1),)


class Segmenter(nn.Module):
    """Segmenter (Strudel et al. 2021): pad -> encode -> decode on the patch grid ->
    upsample -> unpad.

    Args:
        backbone: the encoder.
        decoder: `ViTFeatures` -> patch-level logits [B, K, h, w] (`MaskTransformerDecoder`,
            `LinearDecoder`).
        num_classes: K.
        window: side of the sliding windows of `segment` (Segmenter: the training crop).
    """

    def __init__(self, backbone: VisionTransformer, decoder: nn.Module, num_classes: int, window: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = decoder
        self.num_classes = num_classes
        self.window = window

    def forward(self, images: torch.Tensor, image_sizes: ImageSizes | None = None) -> torch.Tensor:
        """Pixel logits [B, K, H, W] (fp32; channels-last memory for B > 1) for images
        [B, 3, H, W] of any size.

        The decoder's patch-level masks are upsampled (bilinear) to the padded grid's pixels
        and cropped back to H x W: the backbone pads right/bottom to a multiple of the patch.
        Pixels beyond an image's own size (`image_sizes`) are padding.
        """
        # fp32 and channels-last (as the decoders emit it: [B, N, K] transposed) at the patch
        # grid, where it costs nothing: the upsampled logits are then fp32 under autocast (no
        # cast of [B, K, H, W] for the loss) and [B, H, W, K] in memory, the rows
        # `pixel_cross_entropy` reads without a copy. Not for a batch of one: torch cannot
        # tell its memory format from its strides and upsamples it 4x slower than from NCHW
        # (CPU, measured), so it is upsampled as NCHW and copied once by the loss.
        masks = self.head(self.backbone(images, image_sizes)).float()
        masks = masks.contiguous(memory_format=torch.channels_last if len(masks) > 1 else torch.contiguous_format)
        return self.upsample(masks, images.shape[-2:])

    def upsample(self, masks: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
        """Patch-level logits [B, K, h, w] -> pixel logits [B, K, H, W] (`size`): bilinear to
        the padded grid's pixels, then cropped."""
        ph, pw = self.backbone.patch_size
        h, w = masks.shape[-2:]
        logits = F.interpolate(masks, size=(h * ph, w * pw), mode="bilinear", align_corners=False)
        return logits[..., : size[0], : size[1]]

    export_names: ClassVar[tuple[str, ...]] = ("logits",)

    def export_outputs(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Pixel logits [B, K, H, W] of the whole input (the sliding windows of `segment` are
        the caller's loop). `forward`'s memory-format choice is left out: it branches on
        the batch, which would fix an exported graph's batch to its example's (the values
        are the same in either format)."""
        masks = self.head(self.backbone(images)).float()
        return (self.upsample(masks, images.shape[-2:]),)

    @torch.no_grad()
    def segment(
        self,
        images: torch.Tensor,
        image_sizes: ImageSizes | None = None,
        out_sizes: Sequence[Size] | None = None,
        stride: int | None = None,
        scales: Sequence[float] = (1.0,),
        flip: bool = False,
        window_batch_size: int = 4,
    ) -> list[torch.Tensor]:
        """Whole images in sliding windows (mmseg's and Segmenter's evaluation).

        Args:
            images: [B, 3, H, W], padded, with their `ImageSizes`.
            out_sizes: (h, w) to resize each image's logits to (e.g. its label map's or its
                original size); default: its own size.
            stride: window stride (default: the window, Segmenter's 512/512).
            scales, flip: test-time augmentation (probabilities averaged, log returned).
            window_batch_size: windows run through the model at once.

        Returns:
            per image, logits [1, K, h, w] at its `out_sizes` entry.
        """
        return segment_batch(
            self,
            images,
            image_sizes,
            out_sizes,
            self.window,
            stride or self.window,
            self.num_classes,
            scales,
            flip,
            window_batch_size,
        )


#: how detections are read from the queries: DETR's one per query, or the best (query, class) pairs
Selection = Literal["per_query", "top_k"]


def postprocess(
    output: DetectionOutput,
    orig_sizes: Sequence[tuple[int, int]],
    selection: Selection = "per_query",
    top_k: int = 100,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Detections from a DETR output, boxes as absolute (x1, y1, x2, y2) at the original
    (H0, W0), best first.

    Class probabilities are the softmax over the K + 1 logits with "no object" then left out,
    or a sigmoid head's per-class sigmoids (`DetectionOutput.sigmoid`; those heads are read
    with `"top_k"`, as Deformable DETR's `PostProcess`).

    - `"per_query"`: DETR's `PostProcess`: every query is one detection, labelled with its
      most probable real class and scored with that probability (Q per image).
    - `"top_k"`: the `top_k` (query, class) pairs of highest probability, so a query may
      give several detections of different classes (min(top_k, Q * K) per image).

    Args:
        output: logits [B, Q, K + 1], boxes [B, Q, 4] (cx, cy, w, h) in [0, 1].
        orig_sizes: B pairs (H0, W0).

    Returns:
        per-image lists, in fp32: boxes [k, 4], scores [k], labels [k] (sorted by score).
    """
    probs = output.class_probs()  # [B, Q, K]
    b, q, k = probs.shape
    if selection == "per_query":
        scores, labels = probs.max(-1)  # [B, Q]
        scores, queries = scores.sort(dim=1, descending=True, stable=True)
        labels = labels.gather(1, queries)
    elif selection == "top_k":
        scores, flat = probs.flatten(1).topk(min(top_k, q * k), dim=1)
        queries, labels = flat // k, flat % k
    else:
        raise ConfigError(f"selection={selection!r}: expected 'per_query' (DETR's) or 'top_k'")
    boxes_all, scores_all, labels_all = [], [], []
    for i, (height, width) in enumerate(orig_sizes):
        xyxy = box_convert(output.boxes[i, queries[i]].float(), "cxcywh", "xyxy")
        scale = torch.tensor([width, height, width, height], dtype=torch.float32, device=xyxy.device)
        boxes_all.append(xyxy * scale)
        scores_all.append(scores[i])
        labels_all.append(labels[i])
    return boxes_all, scores_all, labels_all


class DETRDetector(nn.Module):
    """A DETR-family detector on the ViT (Carion et al. 2020 and successors): images ->
    `DetectionOutput`, and `detect` -> boxes at each image's original size.

    Args:
        backbone: the encoder.
        head: `ViTFeatures` -> `DetectionOutput` (`DETRHead`, `LWDETRHead`); a head that
            names `feature_indexes` gets those blocks' normalised outputs as intermediates.
        selection: how `detect` reads detections from the queries (see `postprocess`).
        top_k: detections kept per image with `selection="top_k"`.
    """

    def __init__(
        self, backbone: VisionTransformer, head: nn.Module, selection: Selection = "per_query", top_k: int = 100
    ) -> None:
        super().__init__()
        if selection not in ("per_query", "top_k"):
            raise ConfigError(f"selection={selection!r}: expected 'per_query' (DETR's) or 'top_k'")
        self.backbone = backbone
        self.head = head
        self.selection = selection
        self.top_k = top_k

    def forward(
        self,
        images: torch.Tensor,
        image_sizes: ImageSizes | None = None,
        targets: Sequence[BoxTargets] | None = None,
    ) -> DetectionOutput:
        """images [B, 3, H, W] (padded, with their `ImageSizes`) -> logits [B, Q, K + 1] and
        boxes [B, Q, 4] (cx, cy, w, h) in [0, 1] of each unpadded image. `targets` reach a
        head that trains with denoising queries (`head.denoising`); others ignore them."""
        # a multi-level head names the blocks its neck reads (`feature_indexes`)
        blocks = getattr(self.head, "feature_indexes", ())
        features = self.backbone(images, image_sizes, intermediates=blocks, norm_intermediates=True)
        if targets is not None and getattr(self.head, "denoising", False):
            return self.head(features, targets)
        return self.head(features)

    def postprocess(
        self, output: DetectionOutput, orig_sizes: Sequence[Size]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """Per image, boxes [k, 4] (x1, y1, x2, y2) at its (H0, W0), scores [k] and labels [k]."""
        return postprocess(output, orig_sizes, self.selection, self.top_k)

    @torch.no_grad()
    def detect(
        self, images: torch.Tensor, image_sizes: ImageSizes | None = None, orig_sizes: Sequence[Size] | None = None
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """Detections of images [B, 3, H, W]: per image, boxes [k, 4] absolute (x1, y1, x2,
        y2) at its `orig_sizes` entry (default: its own size in the batch), scores [k] and
        labels [k], best first."""
        if image_sizes is None:
            image_sizes = ImageSizes.full(images.shape[0], images.shape[-2:])
        return self.postprocess(self(images, image_sizes), orig_sizes or image_sizes.sizes)

    export_names: ClassVar[tuple[str, ...]] = ("boxes", "scores", "labels")

    def export_outputs(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """boxes [B, N, 4] (x1, y1, x2, y2) pixels of the input, scores [B, N], labels [B, N],
        best first: `postprocess` as tensor operations, for the graph."""
        output = self(images)
        probs = output.class_probs()  # [B, Q, K]
        _, q, k = probs.shape
        if self.selection == "per_query":
            best, classes = probs.max(-1)
            scores, queries = best.topk(q, dim=1)  # every query, best first
            labels = classes.gather(1, queries)
        else:
            scores, flat = probs.flatten(1).topk(min(self.top_k, q * k), dim=1)
            queries, labels = flat // k, flat % k
        boxes = output.boxes.float().gather(1, queries[..., None].expand(-1, -1, 4))  # cx, cy, w, h in [0, 1]
        centre, extent = boxes[..., :2], boxes[..., 2:] / 2
        height, width = images.shape[-2], images.shape[-1]
        xyxy = torch.cat([centre - extent, centre + extent], -1)
        # the scale built from the sizes by tensor ops: symbolic sizes stay symbolic in the graph
        scale = torch.ones(4, device=images.device)
        scale = torch.cat([scale[:1] * width, scale[1:2] * height, scale[2:3] * width, scale[3:] * height])
        return xyxy * scale, scores, labels


class MaskedImageModel(nn.Module):
    """backbone + a self-supervised objective (`vitdense.pretrain`): images -> the
    objective's predictions, targets and hidden patches (`MaskedImageOutput`).

    The objective is the model's `head` as far as training goes (optimised with it), but
    only the backbone is what pre-training is for: downstream tasks load `backbone.*`.
    """

    def __init__(self, backbone: VisionTransformer, objective: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.objective = objective

    @property
    def head(self) -> nn.Module:
        return self.objective

    def forward(
        self,
        images: torch.Tensor,
        image_sizes: ImageSizes | None = None,
        generator: torch.Generator | None = None,
    ):
        """images [B, 3, H, W] (padded, with their `ImageSizes`); `generator` draws the
        masks (None: torch's global generator)."""
        return self.objective(self.backbone, images, image_sizes, generator)


class EoMT(nn.Module):
    """EoMT (Kerssies et al., CVPR 2025): a plain ViT segments by itself. Learned queries
    join the token sequence before the last `head.num_blocks` blocks; class and mask logits
    are read off the queries before each of those blocks (the previous prediction's masks
    restrict the queries' attention in the next block: masked attention, annealed away in
    training) and after the last. One model for semantic, instance and panoptic
    segmentation: the post-processing decides (`vitdense.mask_inference`).

    Args:
        backbone: the encoder; the joined blocks must attend globally.
        head: an `EoMTHead` (queries, class and mask heads, upscaling).
    """

    def __init__(self, backbone: VisionTransformer, head: nn.Module) -> None:
        super().__init__()
        if head.num_blocks > backbone.depth:
            raise ConfigError(
                f"EoMT joins its queries to {head.num_blocks} blocks, but the backbone has {backbone.depth}"
            )
        windowed = backbone.window_size is not None or backbone.num_windows is not None
        joined = range(backbone.depth - head.num_blocks, backbone.depth)
        if windowed and (local := [i for i in joined if i not in backbone.global_attn_indexes]):
            raise ConfigError(
                f"EoMT's queries attend the whole image, but blocks {local} of the backbone attend within windows: "
                "list them in backbone.global_attn_indexes or lower the head's num_blocks"
            )
        self.backbone = backbone
        self.head = head

    @property
    def mask_stride(self) -> int:
        """Input pixels per mask logit (EoMT: 4 for patch 16)."""
        return self.backbone.patch_size[0] // self.head.mask_stride

    def forward(self, images: torch.Tensor, image_sizes: ImageSizes | None = None) -> MaskClassOutput:
        """images [B, 3, H, W] (padded, with their `ImageSizes`) -> `MaskClassOutput`: class
        logits [B, Q, K + 1] and mask logits [B, Q, H', W'] on the padded patch grid times
        the head's `mask_stride`; the earlier blocks' predictions in `aux` in training (and
        in evaluation while masked attention applies, since the masks need them)."""
        backbone, head = self.backbone, self.head
        tokens, sizes = backbone.embed(images, image_sizes)
        grid = (tokens.shape[1], tokens.shape[2])
        x = backbone.add_pos_embed(tokens, sizes)
        keys = backbone.key_mask(sizes, x.device)
        rope = backbone.rotary(sizes, x.device)  # of the patches: the queries, joined in front, are not rotated
        valid = padding_valid(sizes, x.device)
        window = backbone.window_for(grid)
        p, start = backbone.num_prefix_tokens, backbone.depth - head.num_blocks
        attn_mask = keys[:, None, None, :] if keys is not None else None
        aux = []
        for i in range(backbone.depth):
            if i == start:
                x = torch.cat([head.q.weight.to(x.dtype).expand(x.shape[0], -1, -1), x], 1)
                if keys is not None:  # queries are keys for every token
                    keys = F.pad(keys, (head.num_queries, 0), value=True)
                    attn_mask = keys[:, None, None, :]
            if i >= start and head.masks_in_block(i - start):
                class_logits, mask_logits = head.predict(backbone.norm(x), grid, p, valid)
                aux.append((class_logits, mask_logits))
                attn_mask = head.attention_mask(mask_logits, grid, p, keys, i - start)
            elif i >= start:
                attn_mask = keys[:, None, None, :] if keys is not None else None
            x, _ = backbone.run_block(i, x, attn_mask, window if i < start else None, rope=rope)
        class_logits, mask_logits = head.predict(backbone.norm(x), grid, p, valid)
        return MaskClassOutput(class_logits, mask_logits, tuple(aux))

    def image_logits(
        self, output: MaskClassOutput, image_sizes: ImageSizes, out_sizes: Sequence[Size] | None = None
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per image, class logits [Q, K + 1] and fp32 mask logits [Q, h, w] at its
        `out_sizes` entry (default: its own size in the batch): its part of the mask grid,
        upsampled to its pixels (bilinear), cropped to its size and resized (EoMT's
        evaluation), as if it had run alone."""
        out_sizes = out_sizes or image_sizes.sizes
        patch = self.backbone.patch_size
        stride = self.mask_stride
        out = []
        for i, ((h, w), size) in enumerate(zip(image_sizes.sizes, out_sizes, strict=True)):
            gh, gw = _ceil_div(h, patch[0]) * patch[0], _ceil_div(w, patch[1]) * patch[1]
            masks = output.mask_logits[i : i + 1, :, : gh // stride, : gw // stride].float()
            masks = F.interpolate(masks, size=(gh, gw), mode="bilinear")[..., :h, :w]
            if (h, w) != tuple(size):
                masks = F.interpolate(masks, size=tuple(size), mode="bilinear")
            out.append((output.class_logits[i].float(), masks[0]))
        return out

    def semantic(self, images: torch.Tensor) -> torch.Tensor:
        """Class scores [B, K, H, W] of unpadded images [B, 3, H, W]: per pixel, the sum over
        queries of class probability (no object left out) times mask probability (EoMT's
        and Mask2Former's semantic inference); what sliding windows average."""
        output = self(images)
        sizes = ImageSizes.full(images.shape[0], images.shape[-2:])
        return torch.stack([semantic_inference(c, m) for c, m in self.image_logits(output, sizes)])

    @torch.no_grad()
    def segment(
        self,
        images: torch.Tensor,
        image_sizes: ImageSizes | None,
        out_sizes: Sequence[Size] | None,
        window: int,
        stride: int,
        window_batch_size: int = 4,
    ) -> list[torch.Tensor]:
        """Semantic scores of whole images in sliding windows of `window` every `stride`
        pixels (EoMT's semantic evaluation): per image, [1, K, h, w] at its `out_sizes`
        entry (default: its own size)."""
        num_classes = self.head.class_head.out_features - 1
        return segment_batch(
            self.semantic, images, image_sizes, out_sizes, window, stride, num_classes, batch_size=window_batch_size
        )

    export_names: ClassVar[tuple[str, ...]] = ("class_probs", "mask_logits")

    def export_outputs(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Class probabilities [B, Q, K + 1] (softmax, the last "no object") and mask logits
        [B, Q, H, W] at the input's pixels: what semantic, instance and panoptic
        post-processing (`vitdense.mask_inference`) start from."""
        output = self(images)
        h, w = images.shape[-2:]
        masks = F.interpolate(output.mask_logits.float(), scale_factor=self.mask_stride, mode="bilinear")
        return output.class_logits.float().softmax(-1), masks[..., :h, :w]


#: what a depth head's output is: metric depth itself, or inverse depth (DPT's, MiDaS's)
DepthOutputKind = Literal["metric", "inverse"]


class DPT(nn.Module):
    """DPT's monocular depth model (Ranftl et al., ICCV 2021; isl-org/DPT `DPTDepthModel`):
    a ViT and a `DPTHead` reading four of its blocks.

    Args:
        backbone: the encoder (plain or hybrid).
        head: a `DPTHead` (its `hooks` are the blocks, and for DPT-Hybrid the CNN stages, read).
        output: what the head predicts: "metric" depth (metres), or "inverse" depth; with
            "inverse", `depth()` is 1 / (scale * x + shift) as DPT's `invert=True` (its NYU
            model: scale 0.000305, shift 0.1378; KITTI: 0.00006016, 0.00579).
        scale, shift: that affine map of inverse depth.
        relative: the inverse depth is relative (trained scale- and shift-invariant, MiDaS's
            loss): it has no metric scale, `depth()` is not defined, and evaluation aligns it
            to the ground truth first.

    Padding: DPT is not padding-invariant (see `DPTHead`): `estimate` therefore runs the
    images of a batch in groups of one size, each unpadded, so an image padded into a batch
    gives what it gives alone; training batches are crops of one size (no padding).
    """

    def __init__(
        self,
        backbone: VisionTransformer,
        head: nn.Module,
        output: DepthOutputKind = "metric",
        scale: float = 1.0,
        shift: float = 0.0,
        relative: bool = False,
    ) -> None:
        super().__init__()
        if output not in ("metric", "inverse"):
            raise ConfigError(f"DPT output={output!r}: expected 'metric' (depth) or 'inverse' (inverse depth)")
        if relative and output != "inverse":
            raise ConfigError(
                "DPT relative=True: relative depth is learned as inverse depth (MiDaS); set output='inverse'"
            )
        self.backbone = backbone
        self.head = head
        self.output = output
        self.scale = scale
        self.shift = shift
        self.relative = relative
        #: the graph's output: metric depth, or the relative inverse depth (no scale to make it metres)
        self.export_names = ("inverse_depth",) if relative else ("depth",)

    def forward(self, images: torch.Tensor, image_sizes: ImageSizes | None = None) -> torch.Tensor:
        """images [B, 3, H, W] -> the head's output [B, 1, H, W] fp32 (metric or inverse depth,
        as `output`), at the input's pixels.

        DPT predicts at 16 times the patch grid (the input for a patch-16 ViT); another
        token stride (a hybrid's stride 8) is resized to the grid's pixels (bilinear), and the
        right/bottom beyond the input (the backbone pads to whole patches) cropped."""
        head = self.head
        features = self.backbone(images, image_sizes, intermediates=head.block_hooks, stem_stages=head.stage_hooks)
        out = self.head(features).float()
        rh, rw = self.backbone.patch_size
        size = (features.grid_size[0] * rh, features.grid_size[1] * rw)
        if tuple(out.shape[-2:]) != size:
            out = F.interpolate(out, size=size, mode="bilinear", align_corners=False)
        return out[..., : images.shape[-2], : images.shape[-1]]

    def depth(self, raw: torch.Tensor) -> torch.Tensor:
        """Metric depth from the head's output: itself ("metric"), or 1 / (scale * x + shift)
        with the denominator at least 1e-8 ("inverse", DPT's `invert`)."""
        if self.relative:
            raise ValueError("DPT(relative=True) predicts relative inverse depth: no metric depth without alignment")
        if self.output == "metric":
            return raw
        return 1.0 / (self.scale * raw + self.shift).clamp(min=1e-8)

    @torch.no_grad()
    def estimate(
        self, images: torch.Tensor, image_sizes: ImageSizes | None = None, out_sizes: Sequence[Size] | None = None
    ) -> list[torch.Tensor]:
        """Per image, the head's output [h, w] fp32 at its `out_sizes` entry (default: its
        own size), resized bilinearly (DPT's evaluation resizes with bicubic; bilinear keeps
        a non-negative map non-negative).

        Images of one size run together, unpadded (DPT has no padding contract)."""
        if image_sizes is None:
            image_sizes = ImageSizes.full(images.shape[0], images.shape[-2:])
        out_sizes = out_sizes or image_sizes.sizes
        groups: dict[Size, list[int]] = {}
        for i, size in enumerate(image_sizes.sizes):
            groups.setdefault(tuple(size), []).append(i)
        out: list[torch.Tensor | None] = [None] * images.shape[0]
        for (h, w), members in groups.items():
            raw = self(images[members, :, :h, :w])
            for j, i in enumerate(members):
                size = tuple(out_sizes[i])
                x = raw[j : j + 1]
                if tuple(x.shape[-2:]) != size:
                    x = F.interpolate(x, size=size, mode="bilinear", align_corners=False)
                out[i] = x[0, 0]
        return out

    def export_outputs(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """depth [B, 1, H, W] in metres at the input's pixels (`export_names` "depth"), or a
        relative model's inverse depth (`"inverse_depth"`)."""
        raw = self(images)
        return (raw if self.relative else self.depth(raw),)
