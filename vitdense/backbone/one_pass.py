"""One encoder pass for several heads: `VisionTransformer.one_pass`.

Several heads on one encoder (`vitdense.tasks.MultiTask`, `vitdense.models.MultiTaskModel`)
each call the backbone themselves, asking for what they read (DETR's neck: normalised block
outputs; DPT: four raw blocks and the hybrid's CNN stages; Segmenter: the final tokens).
Inside `with backbone.one_pass(request):` the first call encodes the batch once with the
union of what the heads declared (`EncoderRequest`), and every later call on the same
images (the same tensor, or an equal one: each task's own preprocessing may make a copy)
is answered from that pass. The answers are the tensors a call alone would return: the same
blocks run on the same input, and a block output asked for normalised goes through the
final norm as `forward(norm_intermediates=True)` does.

A call the pass cannot answer (other images, another grad or autocast mode, a block nobody
declared) encodes again, with the union widened by what it asked: nothing is ever answered
from a pass that did not compute it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from vitdense.backbone.pos_embed import GridSize
from vitdense.types import ImageSizes


@dataclass(frozen=True)
class EncoderRequest:
    """What a head reads off the encoder beyond its final tokens.

    Attributes:
        intermediates: block indices (negative from the end) whose outputs it reads.
        attentions: block indices whose attention maps it reads (computed unfused: asking
            for them changes those blocks' arithmetic, so the pass is no longer the one a
            head that did not ask would get, to the last bit).
        stem_stages: the hybrid CNN's stages whose maps it reads.
    """

    intermediates: tuple[int, ...] = ()
    attentions: tuple[int, ...] = ()
    stem_stages: tuple[int, ...] = ()

    def union(self, other: EncoderRequest) -> EncoderRequest:
        """Both requests' blocks and stages, in order of first mention."""

        def merged(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
            return tuple(dict.fromkeys((*a, *b)))

        return EncoderRequest(
            merged(self.intermediates, other.intermediates),
            merged(self.attentions, other.attentions),
            merged(self.stem_stages, other.stem_stages),
        )

    def covers(self, other: EncoderRequest, depth: int) -> bool:
        """Whether a pass computed for this request holds everything `other` asks."""

        def blocks(indices: Sequence[int]) -> set[int]:
            return {i % depth for i in indices}

        return (
            blocks(other.intermediates) <= blocks(self.intermediates)
            and blocks(other.attentions) <= blocks(self.attentions)
            and set(other.stem_stages) <= set(self.stem_stages)
        )


def request_of(model: object) -> EncoderRequest:
    """What a model's head reads off its encoder (its `encoder_request`; none declared: the
    final tokens only, and the pass widens on the first call that asks for more)."""
    request = getattr(model, "encoder_request", None)
    return request if isinstance(request, EncoderRequest) else EncoderRequest()


def shared_request(models: Mapping[str, object]) -> EncoderRequest:
    """The union of what several models' heads read off their one encoder."""
    request = EncoderRequest()
    for model in models.values():
        request = request.union(request_of(model))
    return request


@dataclass
class EncodedBatch:
    """One pass of the encoder over a batch, before it is handed to a head.

    Attributes:
        tokens: [B, P + N] final normalised tokens (prefix first), padding tokens zeroed.
        grid: the patch grid (h, w).
        image_sizes: the batch's sizes at the patch stride.
        blocks: {block: raw output [B, P + N, D]} of the blocks computed for the request.
        attentions: {block: attention [B, heads, T, T]}.
        stem: {stage: the hybrid CNN's map [B, C_s, H / s, W / s]}.
        request: what the pass computed.
    """

    tokens: torch.Tensor
    grid: GridSize
    image_sizes: ImageSizes
    blocks: dict[int, torch.Tensor]
    attentions: dict[int, torch.Tensor]
    stem: dict[int, torch.Tensor]
    request: EncoderRequest


@dataclass
class _Entry:
    images: torch.Tensor
    given_sizes: ImageSizes | None
    grad: bool
    autocast: torch.dtype | None
    training: bool
    encoded: EncodedBatch


def _tracing() -> bool:
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()


def _autocast_dtype(device: torch.device) -> torch.dtype | None:
    kind = device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None


def _same_sizes(a: ImageSizes | None, b: ImageSizes | None, images: torch.Tensor) -> bool:
    if a is b:
        return True
    full = ImageSizes.full(images.shape[0], tuple(images.shape[-2:]))
    return (a or full) == (b or full)


def _same_images(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same tensor, or (outside a trace, where values cannot be compared) an equal one."""
    if a is b:
        return True
    if _tracing() or a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    return bool(torch.equal(a, b))


@dataclass
class OnePass:
    """The passes made inside one `VisionTransformer.one_pass` block, and the request each
    new pass computes (what the heads declared, widened by any call that asked for more).

    Attributes:
        request: the union the next pass computes.
        encoded: passes made (a test or a benchmark reads how many the heads needed).
        answered: calls answered from an earlier pass.
    """

    request: EncoderRequest = field(default_factory=EncoderRequest)
    encoded: int = 0
    answered: int = 0
    entries: list[_Entry] = field(default_factory=list)

    def lookup(
        self, images: torch.Tensor, image_sizes: ImageSizes | None, request: EncoderRequest, depth: int, training: bool
    ) -> EncodedBatch | None:
        grad, autocast = torch.is_grad_enabled(), _autocast_dtype(images.device)
        for entry in self.entries:
            if (
                entry.grad == grad
                and entry.autocast == autocast
                and entry.training == training
                and entry.encoded.request.covers(request, depth)
                and _same_images(entry.images, images)
                and _same_sizes(entry.given_sizes, image_sizes, images)
            ):
                self.answered += 1
                return entry.encoded
        return None

    def store(
        self, images: torch.Tensor, image_sizes: ImageSizes | None, encoded: EncodedBatch, training: bool
    ) -> None:
        self.encoded += 1
        self.request = self.request.union(encoded.request)
        entry = _Entry(images, image_sizes, torch.is_grad_enabled(), _autocast_dtype(images.device), training, encoded)
        self.entries.append(entry)
