"""Runtimes of `python -m vitdense export` beyond onnxruntime and `torch.export`:
OpenVINO IR (`--format openvino`) and half-precision ONNX (`--half`).

OpenVINO: the IR (`.xml` + `.bin`, `openvino.save_model`) is converted from the ONNX file
`vitdense.deploy.export.save` writes (the dynamic height and width stay dynamic; converting the
ExportedProgram directly fails on `aten._upsample_bicubic2d_aa`). Two things OpenVINO does
differently from the eager model, and what is done about them:

- its CPU plugin computes cubic `Interpolate` without antialiasing and without ONNX's
  `exclude_outside` (openvinotoolkit/openvino#35893), which the position-embedding resample
  to another grid needs (timm's bicubic with antialiasing; `vitdense.backbone.pos_embed`).
  Each such node is replaced by its exact separable form, two matrix products with the
  filter weights computed in the graph from the sizes (`exact_antialiased_interpolate`);
  without it a plain ViT's IR differs from the model by ~0.1 in the resampled table at any
  grid but the native one.
- on a CPU with AVX512-BF16 or AMX, `compile_model` infers in bfloat16 unless asked
  otherwise: vitdense's runner asks for `INFERENCE_PRECISION_HINT: f32` (`compile_openvino`).
  The weights are stored in fp32 (`save_model`'s default compresses them to fp16).

Half-precision ONNX: weights and compute in float16, `images` and the outputs float32
(`keep_io_types`), by onnxruntime's float16 converter (`onnxruntime.transformers.float16`,
the maintained successor of onnxconverter-common's, shipped in the onnxruntime wheel).
onnxruntime 1.32's CPU session crashes (segfault) building the hybrid demos' float16 graph
(the TorchScript fallback's, GELU decomposed) at its default ORT_ENABLE_ALL; at
ORT_ENABLE_EXTENDED it runs (what `python -m vitdense.bench export-accuracy` uses).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch

from vitdense.core.errors import ConfigError

#: what `compile_openvino` asks of the CPU plugin: f32 (the eager model's numbers) or bf16
#: (the plugin's own default where the CPU computes bf16 natively)
Precision = Literal["f32", "bf16"]

#: ONNX ops left in float32 by `to_half`, besides the converter's own list (ops without
#: float16 kernels). Empty, by measurement (`python -m vitdense.bench export-accuracy`): with
#: every op in float16 the demos lose 0.1 AP (detection) and no mIoU (segmentation);
#: LayerNormalization keeps float32 statistics by itself (its stash_type), and boxes are
#: decoded in [0, 1] and scaled to pixels last
HALF_OP_BLOCK_LIST: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------- OpenVINO
def onnx_to_openvino(onnx_path: Path, path: Path) -> None:
    """Convert an ONNX file to OpenVINO IR at `path` (`.xml`, its weights in `.bin` beside it),
    with weights kept in float32 and antialiased cubic resampling made exact."""
    import openvino as ov

    if path.suffix != ".xml":
        raise ConfigError(f"--output {path}: OpenVINO IR is written as NAME.xml (and NAME.bin beside it)")
    model = ov.convert_model(str(onnx_path))
    exact_antialiased_interpolate(model)
    # save_model compresses weights to fp16 by default: keep the checkpoint's fp32
    ov.save_model(model, str(path), compress_to_fp16=False)


def exact_antialiased_interpolate(model) -> int:
    """Replace each antialiased cubic or linear `Interpolate` over the last two axes of an
    `openvino.Model` by `W_h @ x @ W_w^T`, with the filter weights of torch's antialiased
    kernels (`F.interpolate(..., antialias=True, align_corners=False)`, PIL's filters) built
    in the graph from the input and output sizes; returns how many were replaced.

    Torch's kernel, per output index i of a side in -> out: scale = in / out, support
    s = max(scale, 1), centre c = (i + 0.5) scale; input j weighs f((j + 0.5 - c) / s),
    normalised to sum 1 over the inputs (what ONNX calls exclude_outside). f is the cubic
    filter with a = `cube_coeff` (torch: -0.5) or the triangle 1 - |x|.
    """
    import openvino.opset13 as ops

    replaced = 0
    for node in model.get_ordered_ops():
        if node.get_type_name() != "Interpolate":
            continue
        attrs = node.get_attributes()
        if not attrs.get("antialias") or attrs.get("mode") not in ("cubic", "linear", "linear_onnx"):
            continue
        if (
            attrs.get("shape_calculation_mode") != "sizes"
            or attrs.get("coordinate_transformation_mode") != "half_pixel"
        ):
            raise ConfigError(f"OpenVINO: an antialiased Interpolate with {attrs} is not one vitdense makes exact")
        x = node.input_value(0)
        if node.get_input_size() > 2 or x.get_partial_shape().rank.get_length() != 4:
            raise ConfigError("OpenVINO: an antialiased Interpolate over other than the last two of 4 axes")
        sides = (ops.shape_of(x, "i64"), node.input_value(1))  # [N, C, H, W] in, [N, C, out_h, out_w] out
        cubic = -float(attrs.get("cube_coeff", 0.5)) if attrs["mode"] == "cubic" else None
        rows, cols = _filter_weights(*sides, 2, cubic), _filter_weights(*sides, 3, cubic)
        out = ops.matmul(ops.matmul(rows, x, False, False), cols, False, True)
        out.output(0).get_tensor().set_names(node.output(0).get_names())
        for target in node.output(0).get_target_inputs():
            target.replace_source_output(out.output(0))
        replaced += 1
    if replaced:
        model.validate_nodes_and_infer_types()
    return replaced


def _filter_weights(shape_in, shape_out, axis: int, cubic: float | None):
    """[out, in] weights of torch's antialiased resampling along `axis` of a 4D tensor, from
    its shape in and out (i64 [4] nodes); `cubic`: minus the cubic filter's a (torch: 0.5),
    None for the triangle (bilinear)."""
    import numpy as np
    import openvino.opset13 as ops

    def f32(value: float):
        return ops.constant(np.float32(value))

    index = ops.constant(np.array([axis], np.int64))
    size_in = ops.squeeze(ops.gather(shape_in, index, 0), [0])
    size_out = ops.squeeze(ops.gather(shape_out, index, 0), [0])
    scale = ops.divide(ops.convert(size_in, "f32"), ops.convert(size_out, "f32"))
    support = ops.maximum(scale, f32(1.0))
    start, step = ops.constant(np.int64(0)), ops.constant(np.int64(1))
    rows = ops.range(start, size_out, step, "f32")
    cols = ops.range(start, size_in, step, "f32")
    centre = ops.unsqueeze(ops.multiply(ops.add(rows, f32(0.5)), scale), [1])  # [out, 1]
    t = ops.abs(ops.divide(ops.subtract(ops.add(cols, f32(0.5)), centre), support))  # [out, in]
    if cubic is not None:  # Keys' cubic: ((a + 2) t - (a + 3)) t^2 + 1 on [0, 1), a (t^3 - 5 t^2 + 8 t - 4) on [1, 2)
        a = -cubic
        near = ops.add(ops.multiply(ops.subtract(ops.multiply(f32(a + 2), t), f32(a + 3)), ops.multiply(t, t)), f32(1))
        cube = ops.multiply(ops.add(ops.multiply(ops.subtract(t, f32(5.0)), t), f32(8.0)), t)
        far = ops.multiply(ops.subtract(cube, f32(4.0)), f32(a))
        w = ops.select(ops.less(t, f32(1.0)), near, ops.select(ops.less(t, f32(2.0)), far, f32(0.0)))
    else:  # the triangle
        w = ops.maximum(ops.subtract(f32(1.0), t), f32(0.0))
    return ops.divide(w, ops.reduce_sum(w, ops.constant(np.array([1], np.int64)), keep_dims=True))


def compile_openvino(path: Path, precision: Precision = "f32"):
    """The IR at `path` compiled for the CPU, inferring in `precision` (asked for explicitly:
    the plugin's default is bf16 on CPUs with AVX512-BF16 or AMX)."""
    import openvino as ov

    return ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": precision})


def cpu_has_bf16() -> bool:
    """Whether OpenVINO's CPU plugin computes bf16 natively here (its default precision then)."""
    import openvino as ov

    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def run_openvino(path: Path, images: torch.Tensor, precision: Precision = "f32") -> list[torch.Tensor]:
    """The IR's outputs on `images` [1, 3, H, W], in its declared order."""
    compiled = compile_openvino(path, precision)
    return [torch.from_numpy(x) for x in compiled(images.numpy()).values()]


# ------------------------------------------------------------------------ half-precision ONNX
def to_half(path: Path, output: Path | None = None, op_block_list: tuple[str, ...] = HALF_OP_BLOCK_LIST) -> Path:
    """Convert the float32 ONNX file at `path` to float16 weights and compute, its inputs and
    outputs kept float32 (casts at the edges), written to `output` (default: in place).
    `op_block_list`: op types kept in float32 (added to the converter's own)."""
    import onnx
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    model = onnx.load(str(path))
    half = convert_float_to_float16(
        model, keep_io_types=True, op_block_list=[*DEFAULT_OP_BLOCK_LIST, *op_block_list]
    )  # fmt: skip
    output = output or path
    # a graph over 2 GB (ONNX's protobuf limit) keeps its weights in a file beside it, as torch.onnx does
    large = half.ByteSize() > 2**31 - 1
    onnx.save(half, str(output), save_as_external_data=large, location=f"{output.name}.data" if large else None)
    return output
