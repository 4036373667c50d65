"""`python -m vitdense export --ckpt_path run.ckpt --format onnx|pt2|openvino`: a checkpoint's model as
one graph, with its normalisation inside, for runtimes without vitdense (onnxruntime,
TensorRT, `torch.export.load`, OpenVINO; `--half`: float16 ONNX; `vitdense.deploy.runtimes`). `--format weights` writes the backbone's weights alone, with
timm's names, as `.safetensors` (what `backbone.checkpoint` and timm's `pretrained_cfg_overlay`
load): e.g. a pre-trained encoder (`MaskedImageModelingTask`) for any downstream task.

Every exported graph takes `images`: float32 [B, 3, H, W], RGB pixel values 0..255 (decoded
8-bit images as floats, all of one size), and normalises them as the checkpoint's data did. It
returns what the model declares (`export_outputs`, `export_names` in `vitdense.models`), per
image of the batch:

    classification    probs [B, K] (softmax)
    linear probe      probs [B, K] of the head that validated best
    segmentation      logits [B, K, H, W] of the whole input (the model's forward; the
                      sliding windows of `Segmenter.segment` are the caller's loop)
    detection         boxes [B, N, 4] (x1, y1, x2, y2) pixels of the input, scores [B, N],
                      labels [B, N], best first, post-processed as the checkpoint's
                      `selection` says (DETR's one per query, or the top_k pairs)
    EoMT              class_probs [B, Q, K + 1], mask_logits [B, Q, H, W]
    depth (DPT)       depth (or a relative model's inverse_depth) [B, 1, H, W]

The batch is dynamic (1 to `MAX_BATCH`; traced on 2 images, since torch.export fixes a
dimension whose example is 1) and so are height and width, in multiples of the patch size,
where `torch.export` can trace the model that way (a plain ViT: the position embeddings are
resampled in the graph). Otherwise each is fixed, the sizes to the export size (the hybrid's
ResNet stem), the batch to 1, and the command says which and why: nothing is fixed silently.
The command also runs the written file on one image at another size against the model and
exports again with the batch, then the sizes, fixed where that fails. `--no-dynamic` and
`--no-dynamic-batch` fix them by choice (a runtime that builds for one shape).
"""

from __future__ import annotations

import argparse
import re
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import nn
from torch.export import Dim, ExportedProgram

from vitdense.core.errors import ConfigError
from vitdense.core.preprocess import InferenceData

Format = Literal["onnx", "pt2", "openvino"]
#: largest side the dynamic graphs are declared for
MAX_SIDE = 4096
#: largest batch the dynamic graphs are declared for
MAX_BATCH = 1024


class Normalized(nn.Module):
    """A model behind its data's normalisation: images 0..255 -> (x / 255 - mean) / std ->
    the model's `export_outputs` (each model declares what its graph returns, and the names
    in `export_names`: `vitdense.models`).

    Args:
        model: a model with `export_outputs(images)` and `export_names`.
        mean, std: per channel, in [0, 1] units (timm's), as the checkpoint's data records them.
    """

    def __init__(self, model: nn.Module, mean: list[float], std: list[float]) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1) * 255)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1) * 255)

    @property
    def output_names(self) -> list[str]:
        return list(self.model.export_names)

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        return (images - self.mean) / self.std

    def forward(self, images: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """images [B, 3, H, W] 0..255 -> the model's export outputs (one tensor or a tuple)."""
        outputs = self.model.export_outputs(self.normalize(images))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def exportable(model: nn.Module, mean: list[float], std: list[float]) -> Normalized:
    """The export wrapper of a plain model (`vitdense.models`, or a model of yours with
    `export_outputs` and `export_names`), in evaluation mode."""
    if not callable(getattr(model, "export_outputs", None)) or not getattr(model, "export_names", None):
        raise ConfigError(
            f"{type(model).__name__} cannot be exported: it declares no export_outputs(images) and export_names "
            "(what the graph returns; see vitdense.models.ImageClassifier)"
        )
    return Normalized(model, mean, std).eval()


@dataclass
class Traced:
    """An exported program, and why its dimensions are fixed: `fixed_because` for height and
    width, `batch_fixed_because` for the batch (None: dynamic)."""

    program: ExportedProgram
    fixed_because: str | None
    #: the size asked for: a fixed graph's size
    size: tuple[int, int] = (224, 224)
    #: the example's height and width. Kept here because reading them off the graph's symbolic
    #: shapes with int() adds a guard to the program's shape environment: a `.pt2` saved after
    #: that read was fixed to the example's size ("Guard failed: images.size()[2] == 48" when the
    #: loaded program ran at another size)
    example: tuple[int, int] = (224, 224)
    #: why the batch is fixed to 1 (None: dynamic, 1 to MAX_BATCH images of one size)
    batch_fixed_because: str | None = None


def trace(wrapper: Normalized, height: int, width: int, dynamic: bool = True, dynamic_batch: bool = True) -> Traced:
    """`torch.export` of `wrapper` on an example batch of `height` x `width` images: dynamic
    height and width (`dynamic`) and a dynamic batch (`dynamic_batch`) where asked and
    possible, else each fixed (sizes to the example's, the batch to 1) with the reason.

    Tried in this order, the first that traces kept: both dynamic, then the sizes alone, then
    the batch alone, then neither; a dimension is only fixed after a trace with it dynamic
    failed (that failure is the reason given)."""
    patch = wrapper.model.backbone.patch_size
    if dynamic and (height % patch[0] or width % patch[1]):
        raise ConfigError(
            f"--height {height} --width {width}: a dynamic export's example is in whole patches of {patch}"
        )
    # the example of a dynamic export: at least 3 patches a side (torch.export specialises a side at
    # its declared minimum), and not square (it would take the two sides for one size)
    example_height = max(height, 3 * patch[0]) if dynamic else height
    example_width = max(width, 3 * patch[1]) if dynamic else width
    if dynamic and example_height == example_width:
        example_width += patch[1]
    failed: dict[tuple[bool, bool], str] = {}
    for sizes, batch in dict.fromkeys((s, b) for s in (dynamic, False) for b in (dynamic_batch, False)):
        example = (example_height, example_width) if sizes else (height, width)
        try:
            program = export_program(wrapper, example, sizes, batch)
        except Exception as err:  # torch reports guards it cannot keep symbolic in many exception types
            if not (sizes or batch):  # nothing was dynamic: the model itself does not export
                raise
            failed[sizes, batch] = first_line(err)
            continue
        size_reason = batch_reason = None
        if not sizes:
            size_reason = "--no-dynamic" if not dynamic else (
                f"torch.export cannot keep the sizes symbolic through this model ({failed[True, False]}"
                "; the hybrid ResNet stem's pooling arithmetic is one such case)"
            )  # fmt: skip
        if not batch:
            batch_reason = "--no-dynamic-batch" if not dynamic_batch else (
                f"torch.export cannot keep the batch symbolic through this model ({failed[sizes, True]})"
            )  # fmt: skip
        return Traced(program, size_reason, (height, width), example, batch_reason)
    raise AssertionError("unreachable: the last trace, nothing dynamic, returns or raises")


def export_program(wrapper: Normalized, size: tuple[int, int], dynamic: bool, dynamic_batch: bool) -> ExportedProgram:
    """`torch.export.export` of the wrapper on random 0..255 images of `size`: a batch of 2
    where the batch is dynamic (torch.export specialises a dimension whose example is 0 or 1),
    else of 1."""
    patch = wrapper.model.backbone.patch_size
    shapes: dict[int, object] = {}
    if dynamic_batch:
        shapes[0] = Dim("batch", min=1, max=MAX_BATCH)
    if dynamic:
        # sides in whole patches (the padding arithmetic of other sizes is more than torch.export
        # can keep symbolic), at least 2 per side (a grid of one token is a special case it guards on)
        shapes[2] = patch[0] * Dim("rows", min=2, max=MAX_SIDE // patch[0])
        shapes[3] = patch[1] * Dim("cols", min=2, max=MAX_SIDE // patch[1])
    images = torch.rand(2 if dynamic_batch else 1, 3, *size) * 255
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\..*")
        return torch.export.export(wrapper, (images,), dynamic_shapes={"images": shapes} if shapes else None)


def fixed_trace(wrapper: Normalized, traced: Traced, reason: str) -> Traced:
    """`traced` exported again with its height and width fixed (`reason`), its batch still
    dynamic where it was (and can be)."""
    keep_batch = traced.batch_fixed_because is None
    fixed = trace(wrapper, *traced.size, dynamic=False, dynamic_batch=keep_batch)
    batch_reason = fixed.batch_fixed_because if keep_batch else traced.batch_fixed_because
    return Traced(fixed.program, traced.fixed_because or reason, traced.size, traced.size, batch_reason)


def save(traced: Traced, wrapper: Normalized, path: Path, fmt: Format, outputs: list[str]) -> Traced:
    """Write the program as `.pt2` (`torch.export.save`) or ONNX; returns what was written
    (a dimension fixed, with the reason, where a format needed the fallback).

    ONNX goes through torch's dynamo exporter from the exported program. Where that
    converter fails (the hybrid DETR demo: it could not decompose `nn.MultiheadAttention`
    there), the TorchScript exporter traces the wrapper at the example's size and a batch of
    one (it records the shapes of the one batch it runs). A `.pt2` that cannot be stored
    dynamic (the hybrid's timm "same" padding keeps `math.ceil` of the sizes) is stored at
    the example's size."""
    if fmt == "openvino":  # the ONNX file (in a temporary folder), converted (vitdense.deploy.runtimes)
        from vitdense.deploy.runtimes import onnx_to_openvino

        with tempfile.TemporaryDirectory() as folder:
            onnx_path = Path(folder) / "model.onnx"
            written = save(traced, wrapper, onnx_path, "onnx", outputs)
            path.parent.mkdir(parents=True, exist_ok=True)
            onnx_to_openvino(onnx_path, path)
        return written
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "pt2":
        try:
            torch.export.save(traced.program, path)
            return traced
        except Exception as err:  # e.g. timm's "same" padding leaves math.ceil of sizes, which .pt2 cannot store
            reason = f"torch.export.save: {first_line(err)}"
        fixed = fixed_trace(wrapper, traced, reason)
        torch.export.save(fixed.program, path)
        return fixed
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        try:
            onnx_program = torch.onnx.export(
                traced.program, dynamo=True, input_names=["images"], output_names=outputs, verbose=False
            )
            onnx_program.save(str(path))
            return traced
        except Exception as err:  # torch.onnx's ConversionError and what it wraps
            reason = f"torch.onnx's dynamo converter: {first_line(err.__cause__ or err)}"
        with torch.no_grad():
            torch.onnx.export(
                wrapper, (torch.rand(1, 3, *traced.size) * 255,), str(path), dynamo=False, input_names=["images"],
                output_names=outputs, opset_version=17,
            )  # fmt: skip
    return Traced(
        traced.program, traced.fixed_because or reason, traced.size, traced.example,
        traced.batch_fixed_because or reason,
    )  # fmt: skip


def run_exported(path: Path, fmt: Format, images: torch.Tensor) -> list[torch.Tensor]:
    """The outputs of an exported file on `images` (onnxruntime for ONNX, OpenVINO's CPU
    plugin in fp32 for its IR)."""
    if fmt == "openvino":
        from vitdense.deploy.runtimes import run_openvino

        return run_openvino(path, images)
    if fmt == "pt2":
        with torch.no_grad():
            out = torch.export.load(path).module()(images)
        return list(out) if isinstance(out, tuple) else [out]
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [torch.from_numpy(x) for x in session.run(None, {"images": images.numpy()})]


def check_dynamic(traced: Traced, wrapper: Normalized, path: Path, fmt: Format, outputs: list[str]) -> Traced:
    """A graph with a dynamic dimension, run on a batch of 1 (its example has 2 where the
    batch is dynamic: 1 is the size torch.export treats apart) and, where height and width
    are dynamic, at a size other than its example's, against the eager wrapper. Where it
    fails or differs (beyond 1e-3), the graph is exported again with its batch fixed (where
    it was dynamic) or else its sizes, and checked again. (A converter may keep a size of
    the example somewhere in the graph.)"""
    if traced.fixed_because is not None and traced.batch_fixed_because is not None:
        return traced
    h, w = traced.example  # (not read off the graph: see Traced.example)
    patch = wrapper.model.backbone.patch_size
    size = (h + 2 * patch[0], w + patch[1]) if traced.fixed_because is None else traced.size
    other = torch.rand(1, 3, *size) * 255
    try:
        with torch.no_grad():
            expected = wrapper(other)
        expected = list(expected) if isinstance(expected, tuple) else [expected]
        got = run_exported(path, fmt, other)
        worst = max(float((a.float() - b.float()).abs().max()) for a, b in zip(got, expected, strict=True))
        if worst <= 1e-3:
            return traced
        reason = f"the dynamic graph differs from the model by {worst:.2g} on 1 image of {size[0]} x {size[1]}"
    except Exception as err:  # the runtime refusing a size it was exported for
        reason = f"the dynamic graph fails on 1 image of {size[0]} x {size[1]} ({first_line(err)})"
    if traced.batch_fixed_because is None:  # the batch first: the sizes may be fine at a fixed batch
        again = trace(wrapper, *traced.size, dynamic=traced.fixed_because is None, dynamic_batch=False)
        again = Traced(again.program, traced.fixed_because or again.fixed_because, again.size, again.example, reason)
    else:
        again = fixed_trace(wrapper, traced, reason)
    return check_dynamic(save(again, wrapper, path, fmt, outputs), wrapper, path, fmt, outputs)


def first_line(err: BaseException) -> str:
    """An error in one line: its first, and where torch.export lists what it could not keep
    symbolic on later lines ("  - Not all values of batch ..."), the first of those."""
    lines = str(err).strip().splitlines()
    if not lines:
        return type(err).__name__
    detail = next((line.strip()[2:] for line in lines[1:] if line.strip().startswith("- ")), None)
    return (lines[0] if detail is None else f"{lines[0]} {detail}")[:300]


def describe(traced: Traced, outputs: list[str]) -> list[str]:
    """Input and output shapes of the program, dynamic dimensions named (batch, height, width)."""

    def shape(node) -> str:
        value = node.meta.get("val")
        return "[" + ", ".join(str(d) for d in value.shape) + "]" if value is not None else "?"

    graph = traced.program.graph_module.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder" and n.name == "images"]
    (out,) = [n for n in graph.nodes if n.op == "output"]
    results = out.args[0] if isinstance(out.args[0], (list, tuple)) else [out.args[0]]
    lines = [f"  input  images {shape(placeholders[0])} float32, RGB 0..255 (normalised in the graph)"]
    lines += [f"  output {name} {shape(node)}" for name, node in zip(outputs, results, strict=True)]
    b, _, h, w = placeholders[0].meta["val"].shape

    def named(line: str, size, name: str) -> str:  # a symbol such as 16*s30, as a whole term
        return re.sub(rf"(?<![\w*]){re.escape(str(size))}(?![\w*])", name, line)

    if traced.fixed_because is None:  # the symbols of the input's sides, by name
        lines = [named(named(line, w, "width"), h, "height") for line in lines]
    if traced.batch_fixed_because is None:
        lines = [named(line, b, "batch") for line in lines]
    return lines


def export_checkpoint(
    ckpt_path: str | Path,
    fmt: Format = "onnx",
    output: str | Path | None = None,
    height: int | None = None,
    width: int | None = None,
    dynamic: bool = True,
    dynamic_batch: bool = True,
    half: bool = False,
) -> tuple[Path, Traced, list[str]]:
    """Export a vitdense training checkpoint; (file written, the traced program, output names).
    `half`: ONNX in float16, its input and outputs float32 (`vitdense.deploy.runtimes.to_half`)."""
    from vitdense.deploy.checkpoint import Checkpoint

    if fmt not in ("onnx", "pt2", "openvino"):
        raise ConfigError(f"--format {fmt}: expected onnx, pt2, openvino or weights")
    if half and fmt != "onnx":
        raise ConfigError(f"--half --format {fmt}: float16 is written for ONNX only (--format onnx --half)")
    found = Checkpoint(ckpt_path)
    model = found.for_inference("cpu").model  # (the plain model where the checkpoint records it: no Lightning)
    size = found.data.get("img_size") or 224
    if found.is_multitask:  # one graph, the encoder run once: one normalisation for every task
        from vitdense.deploy.multitask import example_size, normalization

        mean, std = normalization(found)
        size = example_size(found) or size
    elif found.inference is not None:  # the preprocessing the checkpoint recorded
        preprocess = InferenceData.from_data(found.inference).preprocess
        mean, std = preprocess.mean, preprocess.std
    else:  # written before it was recorded: the data's hyperparameters
        mean, std = found.data.get("mean"), found.data.get("std")
    if mean is None or std is None:
        raise ConfigError(f"ckpt_path {found.path}: its data records no mean/std, so the graph cannot normalise")
    wrapper = exportable(model, list(mean), list(std))
    traced = trace(wrapper, height or size, width or size, dynamic, dynamic_batch)
    suffix = {"openvino": ".xml"}.get(fmt, f".{fmt}")
    path = Path(output) if output else found.path.with_name(found.path.stem + ("-fp16" if half else "") + suffix)
    outputs = wrapper.output_names
    traced = check_dynamic(save(traced, wrapper, path, fmt, outputs), wrapper, path, fmt, outputs)
    if half:  # converted once the float32 graph is checked
        from vitdense.deploy.runtimes import to_half

        to_half(path)
    return path, traced, outputs


def export_backbone_weights(ckpt_path: str | Path, output: str | Path | None = None) -> tuple[Path, int]:
    """Write a training checkpoint's backbone weights (timm names) to `.safetensors`; (file
    written, number of tensors). The file loads with `backbone.checkpoint: FILE` into any task
    whose backbone has the same architecture."""
    from safetensors.torch import save_file

    from vitdense.deploy.checkpoint import Checkpoint

    found = Checkpoint(ckpt_path)
    tensors = {k: v.contiguous() for k, v in found.for_inference("cpu").model.backbone.state_dict().items()}
    path = Path(output) if output else found.path.with_suffix(".safetensors")
    save_file(tensors, str(path), metadata={"format": "pt", "source": str(found.path)})
    return path, len(tensors)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m vitdense export",
        description="Export a checkpoint's model (normalisation included) to ONNX, torch.export's .pt2 or OpenVINO IR.",
    )
    p.add_argument("--ckpt_path", required=True, help="a checkpoint written by `python -m vitdense fit`")
    p.add_argument(
        "--format",
        default="onnx",
        help="onnx (default), pt2, openvino (IR: .xml + .bin), or weights (the backbone's, timm names, .safetensors)",
    )
    p.add_argument(
        "--output", help="file to write (default: the checkpoint's path with .onnx / .pt2 / .xml / .safetensors)"
    )
    p.add_argument(
        "--half",
        action="store_true",
        help="ONNX in float16 (weights and compute; images and outputs stay float32), written as NAME-fp16.onnx",
    )
    p.add_argument("--height", type=int, help="example input height (default: the data's img_size)")
    p.add_argument("--width", type=int, help="example input width (default: the data's img_size)")
    p.add_argument("--no-dynamic", dest="dynamic", action="store_false", help="fix height and width to the example's")
    p.add_argument("--no-dynamic-batch", dest="dynamic_batch", action="store_false", help="fix the batch to 1 image")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.format == "weights":
        path, count = export_backbone_weights(args.ckpt_path, args.output)
        print(f"wrote {path} (the backbone's {count} tensors, timm names; load with backbone.checkpoint)")
        return
    path, traced, outputs = export_checkpoint(
        args.ckpt_path, args.format, args.output, args.height, args.width, args.dynamic, args.dynamic_batch, args.half
    )
    files = [path, path.with_suffix(".bin")] if args.format == "openvino" else [path]  # the IR's weights beside it
    size_mb = sum(f.stat().st_size for f in files) / 1e6
    kind = f"{args.format}, float16" if args.half else args.format
    print(f"wrote {path} ({kind}, {size_mb:.1f} MB)")
    print("\n".join(describe(traced, outputs)))
    print("\n".join(dynamic_lines(traced)))


def dynamic_lines(traced: Traced) -> list[str]:
    """What the command says of each dimension: dynamic, or fixed and why."""
    said = []
    if traced.fixed_because is None:
        said.append("  height and width are dynamic (multiples of the patch size)")
    elif traced.fixed_because == "--no-dynamic":
        said.append("  height and width are fixed to the export size (--no-dynamic)")
    else:
        said.append(f"  height and width are FIXED to the export size (dynamic sizes failed: {traced.fixed_because})")
    if traced.batch_fixed_because is None:
        said.append(f"  the batch is dynamic (1 to {MAX_BATCH} images of one size)")
    elif traced.batch_fixed_because == "--no-dynamic-batch":
        said.append("  the batch is fixed to 1 image (--no-dynamic-batch)")
    else:
        said.append(f"  the batch is FIXED to 1 image (a dynamic batch failed: {traced.batch_fixed_because})")
    return said
