"""The help of `python -m vitdense` itself: its name, what vitdense is and every command. A
module of its own, without Lightning's imports, so that `python -m vitdense --help` answers at
once (`__main__` prints it before importing `vitdense.cli`, which takes seconds); the commands
that use a trained model without the trainer (`export`, `serve`; `COMMANDS`, with `combine`) run from here
too, with the command line's one-line errors, so that they never import Lightning."""

from __future__ import annotations

import importlib
import sys
import textwrap

from vitdense.core.errors import CheckpointError, ConfigError, DataError, NonFiniteError

#: errors of the user's making (config, files, data) that deserve one line, not a traceback;
#: any other exception is a bug and keeps its traceback
USER_ERRORS = (FileNotFoundError, NotADirectoryError, CheckpointError, ConfigError, DataError, NonFiniteError)
#: subcommands beside LightningCLI's: name -> (module whose `main(argv)` runs it, the extra it needs, if any)
COMMANDS = {
    "export": ("vitdense.deploy.export", "export"),
    "serve": ("vitdense.deploy.serve", "serve"),
    "combine": ("vitdense.tasks.multitask", None),  # (this one imports Lightning: it builds the tasks)
}

#: how the command line names itself in its usage lines (not "__main__.py")
PROG = "python -m vitdense"
DESCRIPTION = (
    "vitdense is a PyTorch Lightning plugin for Vision Transformer downstream tasks: one ViT backbone "
    "(timm's names and weights: the paper's ViT and its ResNet hybrid, DINOv3, EVA-02, Perception Encoder) "
    "whose tokens feed interchangeable task families, trained and evaluated from YAML recipes (configs/) "
    "and used outside the trainer: a checkpoint predicts from Python (vitdense.load), exports to ONNX, "
    "torch.export's .pt2 or OpenVINO, or serves over HTTP."
)
#: every task family, by its class in `vitdense.tasks` (`model.class_path`), in one line each
FAMILY_HELP = {
    "ClassificationTask": "image classification, fine-tuned (the paper's; Mixup / CutMix)",
    "LinearProbeTask": "linear probes on a frozen backbone (MAE's, DINOv2's)",
    "SegmentationTask": "semantic segmentation, Segmenter's linear or mask-transformer decoder",
    "UniversalSegmentationTask": "semantic, instance and panoptic segmentation with EoMT",
    "DetectionTask": "object detection with DETR's or LW-DETR / RF-DETR's head",
    "DepthTask": "monocular depth with DPT's head (SILog, MiDaS's losses)",
    "MaskedImageModelingTask": "pre-training without labels: masked patch prediction, MAE",
    "FeatureDistillationTask": "pre-training without labels: a frozen teacher's features taught to the backbone",
    "MultiTask": "several of these tasks trained on one encoder, each from its own data",
}
#: every command of `python -m vitdense`, in one line each (LightningCLI's four and vitdense's own)
COMMAND_HELP = {
    "fit": "train a task from a recipe: --config configs/NAME.yaml",
    "validate": "evaluate a checkpoint on the validation split",
    "test": "evaluate a checkpoint on the test split",
    "predict": "predict images with a checkpoint, written to files",
    "export": "export a checkpoint's model to ONNX, torch.export's .pt2 or OpenVINO",
    "serve": "serve a checkpoint's predictor over HTTP (LitServe)",
    "combine": "combine single-task checkpoints on one frozen encoder into one multi-task checkpoint",
}


def top_level_help() -> str:
    """The help of `python -m vitdense` itself (`--help`, `-h`, no arguments). Not LightningCLI's,
    which calls itself "__main__.py" and "Lightning Trainer command line tool", lists only its
    four subcommands and takes seconds to build."""
    commands = "\n".join(f"  {name:<10}  {line}" for name, line in COMMAND_HELP.items())
    width = max(map(len, FAMILY_HELP))
    families = "\n".join(f"  {name:<{width}}  {line}" for name, line in FAMILY_HELP.items())
    return (
        f"usage: {PROG} {{{','.join(COMMAND_HELP)}}} [options]\n\n"
        f"{textwrap.fill(DESCRIPTION, 88)}\n\n"
        f"commands:\n{commands}\n\n"
        f"task families (model.class_path: vitdense.tasks.NAME; a recipe for each in configs/):\n{families}\n\n"
        f"Each command's options: {PROG} COMMAND --help (e.g. {PROG} fit --help).\n\n"
        "Separate modules, each with its own --help:\n"
        "  python -m vitdense.viz    analyses and figures (the ViT paper's, the heads' attention)\n"
        "  python -m vitdense.bench  benchmarks against the peers they measure (timm, torchvision, ...)\n"
    )


#: the command lines answered with `top_level_help`
HELP_ARGS = ([], ["-h"], ["--help"])


def print_top_level_help(argv: list[str]) -> None:
    """Print the help and exit: on stdout with 0 when asked for (`-h`, `--help`), on stderr
    with 2 and an error when no command was given (a usage error, with the help to choose one)."""
    if argv:
        print(top_level_help(), end="")
        raise SystemExit(0)
    print(top_level_help(), end="", file=sys.stderr)
    print(f"{PROG}: error: no command given", file=sys.stderr)
    raise SystemExit(2)


def user_message(err: BaseException) -> str:
    """The error's own message, also when a DataLoader worker raised it: torch re-raises it in
    the main process wrapped in the worker's traceback ("Caught DataError in DataLoader worker
    process 0. Original Traceback ..."), whose last line is the original `Type: message`."""
    message = str(err)
    if "Original Traceback" in message:
        last = message.rstrip().splitlines()[-1]
        prefix = f"{type(err).__module__}.{type(err).__qualname__}: "
        for name in (prefix, f"{type(err).__qualname__}: "):
            if last.startswith(name):
                return last[len(name) :]
    return message


def _exit_with(err: BaseException) -> None:
    print(f"vitdense: error: {user_message(err)}", file=sys.stderr)
    raise SystemExit(2) from err


def run_command(name: str, argv: list[str]) -> None:
    """`python -m vitdense <name> ...` for a name of `COMMANDS`: its own parser, the same
    one-line errors as the rest of the command line."""
    module, extra = COMMANDS[name]
    try:
        command = importlib.import_module(module)
    except ImportError as err:
        if err.name is None or err.name.startswith("vitdense") or extra is None:
            raise
        print(f"vitdense: error: {name} needs {err.name}: pip install 'vitdense[{extra}]'", file=sys.stderr)
        raise SystemExit(2) from err
    try:
        command.main(argv)
    except USER_ERRORS as err:
        _exit_with(err)
