"""`multitask`: one graph with K heads on one encoder (`vitdense.models.MultiTaskModel`) against
the K single-task models it is made of, each with its own copy of the same encoder. Issue 41:
"latency of one graph with K heads against K single-task models on the same encoder (eager and
onnxruntime, batch 1 and 8, the CPU named), and the parameter and memory totals".

    python -m vitdense.bench multitask                       # ViT-S/16, 224 x 224, batch 1 and 8
    python -m vitdense.bench multitask --heads det seg --batch 1 --runtimes eager --repeats 20

What is built: `DetectionTask`, `SegmentationTask` and `DepthTask` (`--heads`, any subset, in
that order) on `--backbone` at `--img-size`, random weights (no download), each task's plain
model taken (`task.model`) and its encoder given the first one's weights. The heads, at the
sizes a ViT-S model would use:

    det    DETRHead: 256 wide, 100 queries, 8 heads, 3 decoder layers, FFN 1024, 80 classes
    seg    MaskTransformerDecoder (Segmenter's, the task's default): 2 layers, 150 classes
    depth  DPTHead: 64 features, reassemble channels 48 / 96 / 192 / 384 (Depth Anything's
           ViT-S), metric depth

The multi-task model is `MultiTaskModel` over copies of these models (one encoder object,
run once per forward); the single-task models keep their own encoders. What runs is each
model's export wrapper (`vitdense.deploy.export.exportable`: the normalisation, the model's
`export_outputs`, e.g. DETR's post-processing) on random 0..255 images, in fp32:

    (a) the multi-task graph: all K heads' outputs, one encoder pass
    (b) the K single-task models, one after another on the same images (K encoder passes)
    (c) the encoder alone (its final patch tokens), the pass (a) makes once and (b) makes K times

in eager PyTorch (`torch.inference_mode`) and in onnxruntime (CPU provider), at each `--batch`.
ONNX: each of the K + 2 graphs is exported once, through `vitdense.deploy.export` (`trace`,
`save`: what `python -m vitdense export` writes), with a dynamic batch; where that graph fails
or differs from its eager wrapper (beyond 1e-3) at a batch size, a graph with that batch fixed
is exported for it. `--exporter torchscript`: torch's older tracer instead (which `save` falls
back to where the dynamo converter fails), seconds rather than tens of seconds to write, one
graph per batch size (it records the shapes of the batch it traces). onnxruntime runs with torch's
intra-op thread count (`--threads`, default torch's) and its threads' spinning off: the K + 2
sessions' thread pools live in one process and run in turn, and a pool left spinning after its
run takes the cores from the next session (and from other processes on a shared machine).

Timing: `--warmup` rounds, then `--repeats` rounds taking (a), (b), (c) in turn, the order
reversed every other round (drift of a shared machine hits all three alike); median and
minimum wall milliseconds per batch. Printed: (b) / (a), the milliseconds sharing saved
(b - a) and what ideal sharing would save, (K - 1) x (c), and the ratio that would give,
(b) / ((b) - (K - 1) x (c)).

Checked first: the multi-task graph's outputs against the single models' (max |difference|
over every output): 0.0 in eager fp32 (`MultiTaskModel` hands each head the features its
model computes alone), at most 1e-4 in onnxruntime. Otherwise no timing is printed and the
command exits with status 1.

Parameters: the multi-task model (the encoder once) against the sum over the K single-task
models (the encoder K times), counts and fp32 bytes. Memory: the peak resident set (RSS) one
eager forward adds, at the largest `--batch`, of (a), (b) (the K models in turn) and (c):
the kernel's high-water mark VmHWM, reset through /proc/self/clear_refs after glibc's
`malloc_trim` returned freed heap pages, minus the RSS before the forward (Linux only; else
not measured, and the printout says so). It counts every page the forward touched (torch's
tensors, oneDNN's scratch buffers), which Python's tracemalloc would not see.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import os
import re
import statistics
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
from torch import nn

from vitdense.bench.common import cpu_kind, time_call
from vitdense.bench.seg_heads import native_bf16

#: the heads the bench knows, in the order they join the multi-task model
HEADS = ("det", "seg", "depth")
#: what each head is (the printout's words; see the module docstring)
HEAD_WORDS = {
    "det": "DETRHead (256 wide, 100 queries, 3 decoder layers, 80 classes)",
    "seg": "MaskTransformerDecoder (2 layers, 150 classes)",
    "depth": "DPTHead (64 features, metric depth)",
}
#: ONNX outputs may differ from each other by float rounding, no more
ONNX_TOLERANCE = 1e-4
#: an ONNX graph further than this from its eager wrapper is exported again with the batch fixed
#: (`vitdense.deploy.export.check_dynamic`'s bound)
GRAPH_TOLERANCE = 1e-3
#: why `--exporter torchscript` writes a graph per batch size (`vitdense.deploy.export.save` says the same)
TORCHSCRIPT_BATCH = "the tracer records the shapes of the batch it runs"
#: the three ways timed, in the order of the table
MULTI, SINGLES, ENCODER = "multi", "singles", "encoder"


class EncoderOnly(nn.Module):
    """The encoder as an exportable model: images -> its final patch tokens [B, N, D]."""

    export_names = ("tokens",)

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone

    def export_outputs(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (self.backbone(images).patch_tokens,)


@dataclass
class Models:
    """The K single-task models (each its own encoder), the multi-task model over copies of
    them (one encoder) and the encoder alone, each behind its export wrapper."""

    singles: dict[str, nn.Module]
    multi: nn.Module
    encoder: nn.Module
    #: the export wrappers: MULTI, ENCODER and each single's name
    wrappers: dict[str, nn.Module] = field(default_factory=dict)


def build_models(args: argparse.Namespace) -> Models:
    """The heads of `args.heads` on `args.backbone` (random weights), their encoders equal."""
    from vitdense.deploy.export import exportable
    from vitdense.heads import DETRHead, DPTHead, MaskTransformerDecoder
    from vitdense.models.multitask import MultiTaskModel
    from vitdense.tasks import BackboneConfig, DepthTask, DetectionTask, SegmentationTask

    model_args = {"depth": args.depth} if args.depth else None
    backbone = BackboneConfig(name=args.backbone, img_size=args.img_size, model_args=model_args)
    builders = {
        "det": lambda: DetectionTask(
            num_classes=80,
            head=partial(DETRHead, hidden_dim=256, num_queries=100, num_heads=8, dim_feedforward=1024, dec_layers=3),
            backbone=backbone,
        ),
        "seg": lambda: SegmentationTask(
            num_classes=150, head=partial(MaskTransformerDecoder, depth=2), backbone=backbone
        ),
        "depth": lambda: DepthTask(
            head=partial(DPTHead, features=64, out_channels=(48, 96, 192, 384)), backbone=backbone, max_depth=10.0
        ),
    }
    torch.manual_seed(0)
    singles = {name: builders[name]().model.eval() for name in args.heads}
    first = next(iter(singles.values())).backbone.state_dict()
    for model in singles.values():
        model.backbone.load_state_dict(first)
    multi = MultiTaskModel({name: copy.deepcopy(model) for name, model in singles.items()}).eval()
    encoder = EncoderOnly(copy.deepcopy(multi.backbone)).eval()
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    wrappers = {MULTI: exportable(multi, mean, std), ENCODER: exportable(encoder, mean, std)}
    wrappers |= {name: exportable(model, mean, std) for name, model in singles.items()}
    return Models(singles, multi, encoder, wrappers)


def count(module: nn.Module) -> int:
    """Parameters, each once (a module shared by several models counts once)."""
    return sum(p.numel() for p in module.parameters())


def parameter_totals(models: Models) -> dict[str, int]:
    return {
        "encoder": count(models.multi.backbone),
        MULTI: count(models.multi),
        SINGLES: sum(count(m) for m in models.singles.values()),
    }


def as_tuple(outputs: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return outputs if isinstance(outputs, tuple) else (outputs,)


def max_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """The largest |a - b| over paired tensors (fp64; integer labels compared as numbers)."""
    return max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b, strict=True))


#: a graph's run on a batch: images [B, 3, H, W] 0..255 -> its outputs
Run = Callable[[torch.Tensor], tuple[torch.Tensor, ...]]


def three_ways(runs: dict[str, Run], singles: list[str], images: torch.Tensor) -> dict[str, Callable[[], object]]:
    """(a), (b), (c) on `images`, from one runtime's runs of each graph by name."""
    return {
        MULTI: partial(runs[MULTI], images),
        SINGLES: lambda: [runs[name](images) for name in singles],
        ENCODER: partial(runs[ENCODER], images),
    }


def multi_vs_singles(outputs: dict[str, tuple[torch.Tensor, ...]], singles: list[str]) -> float:
    """max |multi-task outputs - the single models' outputs|, paired in the multi-task graph's
    order (`MultiTaskModel.export_names`: each model's outputs, in model order)."""
    return max_difference(list(outputs[MULTI]), [out for name in singles for out in outputs[name]])


def eager_runs(models: Models) -> dict[str, Run]:
    def call(wrapper: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with torch.inference_mode():
            return as_tuple(wrapper(images))

    return {name: partial(call, wrapper) for name, wrapper in models.wrappers.items()}


def encoder_passes(models: Models, images: torch.Tensor) -> tuple[int, int]:
    """Encoder passes of one multi-task forward and of the K single forwards (each counted
    by its backbone's `one_pass`)."""
    with torch.inference_mode():
        with models.multi.backbone.one_pass() as shared:
            models.wrappers[MULTI](images)
        singles = 0
        for name, model in models.singles.items():
            with model.backbone.one_pass() as alone:
                models.wrappers[name](images)
            singles += alone.encoded
    return shared.encoded, singles


class OnnxGraphs:
    """The K + 2 graphs in onnxruntime: exported once with a dynamic batch, and again with
    the batch fixed for a batch size the dynamic graph fails or gets wrong."""

    def __init__(self, models: Models, args: argparse.Namespace, folder: Path) -> None:
        self.models, self.args, self.folder = models, args, folder
        #: {(graph, batch): session}, batch None for the dynamic-batch graph
        self.sessions: dict[tuple[str, int | None], object] = {}
        #: {graph: why its batch is fixed per batch size} (absent: one dynamic-batch graph)
        self.fixed: dict[str, str] = {}
        if args.exporter == "torchscript":  # (exported for each batch size as `runs` meets it)
            self.fixed = dict.fromkeys(models.wrappers, TORCHSCRIPT_BATCH)
            return
        for name in models.wrappers:
            self.export(name, None)

    def export(self, name: str, batch: int | None) -> None:
        """Write graph `name`, its batch dynamic (None) or fixed to `batch`, and open its session
        (a dynamic export whose batch `vitdense.deploy.export` fixed to 1 is kept as batch 1's)."""
        from vitdense.deploy.export import Traced, save, trace

        wrapper = self.models.wrappers[name]
        outputs = list(wrapper.output_names)
        path = self.folder / f"{name}-{batch or 'dynamic'}.onnx"
        size = self.args.img_size
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if self.args.exporter == "torchscript":  # (always a batch: TORCHSCRIPT_BATCH)
                example = torch.rand(batch, 3, size, size) * 255
                torch.onnx.export(
                    wrapper, (example,), str(path), dynamo=False, input_names=["images"], output_names=outputs,
                    opset_version=17,
                )  # fmt: skip
            elif batch is None:
                written = save(trace(wrapper, size, size, dynamic=False), wrapper, path, "onnx", outputs)
                if written.batch_fixed_because is not None:
                    self.fixed[name] = written.batch_fixed_because
                    batch = 1
            else:  # (`trace` fixes a batch to 1 only)
                program = torch.export.export(wrapper, (torch.rand(batch, 3, size, size) * 255,))
                fixed = f"--batch {batch}"
                save(Traced(program, fixed, (size, size), (size, size), fixed), wrapper, path, "onnx", outputs)
        self.sessions[name, batch] = self.session(path)

    def session(self, path: Path) -> object:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 4  # (a graph refusing a batch size is reported as the exception, once)
        return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def run(self, name: str, batch: int | None, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs = self.sessions[name, batch].run(None, {"images": images.numpy()})
        return tuple(torch.from_numpy(x) for x in outputs)

    def runs(
        self, images: torch.Tensor, expected: dict[str, tuple[torch.Tensor, ...]]
    ) -> tuple[dict[str, Run], dict[str, tuple[torch.Tensor, ...]]]:
        """The graphs for `images`' batch size, and their outputs on `images`: the dynamic ones
        where they give what the eager wrappers gave (`expected`, within `GRAPH_TOLERANCE`),
        else graphs with that batch fixed."""
        b = images.shape[0]
        runs: dict[str, Run] = {}
        outputs: dict[str, tuple[torch.Tensor, ...]] = {}
        for name in self.models.wrappers:
            key = b if name in self.fixed else None
            if (name, key) not in self.sessions:
                self.export(name, key)
            try:
                outputs[name] = self.run(name, key, images)
            except Exception as err:  # onnxruntime refusing a batch the dynamic graph holds fixed
                if key is not None:  # (a graph exported for this batch: nothing to fall back to)
                    raise
                failure = runtime_error(err)
            else:
                worst = max_difference(list(outputs[name]), list(expected[name]))
                failure = None if worst <= GRAPH_TOLERANCE else f"it differs from eager by {worst:.2g}"
            if failure is not None and key is None:
                self.fixed[name] = f"with a dynamic batch, {failure} at batch {b}"
                key = b
                self.export(name, b)
                outputs[name] = self.run(name, key, images)
            runs[name] = partial(self.run, name, key)
        return runs, outputs


def runtime_error(err: Exception) -> str:
    """onnxruntime's error in a few words: the node that failed, where it says."""
    message = str(err).strip()
    node = re.search(r"running (\w+) node\. Name:'([^']+)'", message)
    return f"its {node[1]} node {node[2]} fails" if node else message.splitlines()[0][:120]


def timed_rounds(steps: dict[str, Callable[[], object]], repeats: int, warmup: int) -> dict[str, tuple[float, float]]:
    """{name: (median ms, min ms)} over `repeats` rounds after `warmup`, the steps taken in
    turn, the order reversed every other round."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    order = list(steps)
    for i in range(warmup + repeats):
        for name in order if i % 2 == 0 else order[::-1]:
            elapsed = time_call(steps[name], torch.device("cpu"))
            if i >= warmup:
                times[name].append(elapsed * 1000)
    return {name: (statistics.median(ts), min(ts)) for name, ts in times.items()}


def peak_rss_mb(fn: Callable[[], object]) -> float | None:
    """MB the resident set peaks above where it was, during `fn()` (None: not on Linux).
    Freed heap pages are returned first (glibc's `malloc_trim`), so that memory `fn` reuses
    from an earlier call is counted again."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the high-water mark back to the current RSS
        before = _status_kb("VmRSS")
        fn()
        return (_status_kb("VmHWM") - before) / 1024
    except OSError:
        return None


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {key}")


@dataclass
class MultitaskResult:
    params: dict[str, int]
    #: peak RSS MB of one eager forward at the largest batch, per way (None: not measured)
    memory: dict[str, float | None]
    #: encoder passes of one forward: (multi-task, the K singles together)
    passes: tuple[int, int]
    #: {(runtime, batch): max |multi-task - singles|}
    differences: dict[tuple[str, int], float]
    #: {(runtime, batch): {way: (median ms, min ms)}}; empty when the outputs differ
    times: dict[tuple[str, int], dict[str, tuple[float, float]]]
    #: {graph: why its batch is fixed} (ONNX)
    fixed_batch: dict[str, str]
    load: tuple[float, float]
    #: why no timing is printed, or None
    refused: str | None = None


def bench_multitask(args: argparse.Namespace) -> MultitaskResult:
    if args.threads:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    models = build_models(args)
    singles = list(models.singles)
    generator = torch.Generator().manual_seed(0)
    size = args.img_size
    images = {b: torch.rand(b, 3, size, size, generator=generator) * 255 for b in args.batch}
    runs = {("eager", b): eager_runs(models) for b in args.batch}
    # every graph's outputs once per batch size (also the first calls, which allocate what every
    # later one reuses: oneDNN's kernels, caches)
    outputs = {("eager", b): {name: run(images[b]) for name, run in runs["eager", b].items()} for b in args.batch}
    largest = max(args.batch)
    memory = {
        way: peak_rss_mb(step) for way, step in three_ways(runs["eager", largest], singles, images[largest]).items()
    }
    fixed: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as folder:
        if "onnx" in args.runtimes:
            graphs = OnnxGraphs(models, args, Path(folder))
            for b in args.batch:
                runs["onnx", b], outputs["onnx", b] = graphs.runs(images[b], outputs["eager", b])
            fixed = graphs.fixed
        differences = {key: multi_vs_singles(out, singles) for key, out in outputs.items()}
        del outputs
        result = MultitaskResult(
            parameter_totals(models), memory, encoder_passes(models, images[min(args.batch)]), differences, {},
            fixed, (load, load),
        )  # fmt: skip
        bad = [
            f"{runtime} batch {b}: {d:.3g}"
            for (runtime, b), d in differences.items()
            if d > (0.0 if runtime == "eager" else ONNX_TOLERANCE)
        ]
        if bad:
            result.refused = (
                f"the multi-task outputs differ from the single models' ({', '.join(bad)}; allowed: 0.0 in eager, "
                f"{ONNX_TOLERANCE:g} in onnxruntime): no timing printed"
            )
            return result
        for b in args.batch:
            for runtime in args.runtimes:
                steps = three_ways(runs[runtime, b], singles, images[b])
                result.times[runtime, b] = timed_rounds(steps, args.repeats, args.warmup)
    result.load = (load, os.getloadavg()[0])
    return result


def onnx_missing(dynamo: bool) -> str | None:
    """How to install what the ONNX runtime needs when it cannot be imported, else None."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401

        if dynamo:  # (torch.onnx's dynamo exporter writes through onnxscript)
            import onnxscript  # noqa: F401
    except ImportError as err:
        return (
            f"multitask --runtimes onnx needs {err.name}, which is not installed: pip install 'vitdense[export]' "
            "(onnx, onnxruntime, onnxscript), or leave ONNX out with --runtimes eager"
        )
    return None


def run_multitask(args: argparse.Namespace) -> None:
    if "onnx" in args.runtimes and (message := onnx_missing(args.exporter == "dynamo")) is not None:
        print(f"vitdense.bench: error: {message}", file=sys.stderr)
        raise SystemExit(2)
    result = bench_multitask(args)
    print_multitask(args, result)
    if result.refused is not None:
        raise SystemExit(1)


def print_multitask(args: argparse.Namespace, result: MultitaskResult) -> None:
    k = len(args.heads)
    heads = " + ".join(args.heads)
    depth = f", {args.depth} blocks" if args.depth else ""
    bf16 = "native bf16" if native_bf16() else "bf16 emulated (no AVX512-BF16 or AMX)"
    versions = f"torch {torch.__version__}"
    if "onnx" in args.runtimes:
        import onnxruntime

        versions += f", onnxruntime {onnxruntime.__version__}"
    print(
        f"multitask: {heads} on one {args.backbone} (random weights{depth}) at {args.img_size} x {args.img_size}, fp32"
    )
    print(
        f"CPU: {cpu_kind()}, {bf16}; {versions}; {torch.get_num_threads()} threads (torch"
        f"{' and onnxruntime, its spinning off' if 'onnx' in args.runtimes else ''}); "
        f"load average {result.load[0]:.2f}"
    )
    for name in args.heads:
        print(f"  {name:6}{HEAD_WORDS[name]}")
    p = result.params
    print(f"{'parameters':44}{'count':>14}{'MB (fp32)':>12}")
    rows = {
        "encoder": p["encoder"],
        "multi-task model (encoder once)": p[MULTI],
        f"{k} single-task models (encoder {k} times)": p[SINGLES],
        "singles - multi-task": p[SINGLES] - p[MULTI],
    }
    for label, n in rows.items():
        print(f"  {label:42}{n:14,}{n * 4 / 2**20:12.1f}")
    saved = (p[SINGLES] - p[MULTI]) / p["encoder"]
    print(f"  saved: {saved:g} x the encoder's parameters (K - 1 = {k - 1})")
    batch = max(args.batch)
    labels = {
        MULTI: "(a) multi-task graph",
        SINGLES: f"(b) {k} single-task models in turn",
        ENCODER: "(c) encoder alone",
    }
    print(f"memory of one eager forward at batch {batch}, peak RSS delta (VmHWM after clear_refs, malloc_trim)")
    for way, mb in result.memory.items():
        print(f"  {labels[way]:42}{'not measured (no /proc)' if mb is None else f'{mb:.0f} MB':>26}")
    print(f"encoder passes per forward: {result.passes[0]} (multi-task), {result.passes[1]} ({k} single-task models)")
    print("outputs, max |multi-task - single-task| over every output:")
    for (runtime, b), d in result.differences.items():
        print(f"  {runtime:8}batch {b:<4}{d:.3g}" if d else f"  {runtime:8}batch {b:<4}0.0")
    if "onnx" in args.runtimes:
        if args.exporter == "torchscript":
            print(f"onnx graphs: torch's TorchScript exporter, {k + 2} graphs per batch size ({TORCHSCRIPT_BATCH})")
        else:
            how = "; ".join(f"{name}: batch fixed per size ({why})" for name, why in result.fixed_batch.items())
            print(
                f"onnx graphs: vitdense.deploy.export (dynamo), {k + 2} graphs, dynamic batch"
                f"{f' except {how}' if how else ''}"
            )
    if result.refused is not None:
        print(f"refused: {result.refused}")
        return
    print(
        f"latency ms per batch, median (min) of {args.repeats} alternating rounds; "
        f"ideal: (c) x {k - 1} saved; load average {result.load[0]:.2f} -> {result.load[1]:.2f}"
    )
    print(
        f"{'runtime':8}{'batch':>6}{'(a) multi':>18}{f'(b) {k} singles':>18}{'(c) encoder':>18}"
        f"{'(b)/(a)':>9}{'saved ms':>10}{'ideal ms':>10}{'ideal (b)/(a)':>15}"
    )
    for (runtime, b), t in result.times.items():
        (a, a_min), (s, s_min), (c, c_min) = t[MULTI], t[SINGLES], t[ENCODER]
        ideal = (k - 1) * c
        cells = "".join(f"{f'{m:.1f} ({lo:.1f})':>18}" for m, lo in ((a, a_min), (s, s_min), (c, c_min)))
        ideal_ratio = f"{s / (s - ideal):.2f}" if s > ideal else "-"  # (noise can make (c) look that slow)
        print(f"{runtime:8}{b:>6}{cells}{s / a:9.2f}{s - a:10.1f}{ideal:10.1f}{ideal_ratio:>15}")
