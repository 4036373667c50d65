"""`python -m vitdense fit|validate|test|predict --config configs/….yaml` (LightningCLI).

Model and data are chosen by `class_path` (subclass mode), so a user's own task or
DataModule works from YAML. What belongs to the data is linked from the DataModule to the
task and never written twice: the number of classes, the class names and the image size
(the encoder's native size, to which its position embeddings are resampled). The other way,
the encoder's name goes to the DataModule, which normalises images as the encoder was
pretrained.

A checkpoint is self-contained: `validate`, `test` and `predict` with `--ckpt_path` and no
`--config` take the task and the DataModule (classes, normalisation, evaluation sizes) from
the checkpoint, e.g. `python -m vitdense predict --ckpt_path run.ckpt --data.predict_dir
photos/`. With a config, the checkpoint's task must be the config's, and its classes the
data's; what the data decided and the config leaves unset (normalisation, categories) comes
from the checkpoint. The task's recorded settings fill what the user leaves unset; what the
user gives wins for the task's `evaluation_settings` (a crop, a cap, the kind of
segmentation) and is refused, naming the key, where it differs from a setting fixed at
training. A checkpoint's weights replace pretrained ones, which are then never fetched
(works offline).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import sys
import warnings
from functools import partial
from pathlib import Path
from typing import Any, Optional

import lightning as L
import yaml
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from vitdense.cli_help import (  # (the commands without Lightning, export and serve, run from there)
    COMMANDS,
    DESCRIPTION,
    HELP_ARGS,
    PROG,
    USER_ERRORS,
    _exit_with,
    print_top_level_help,
    run_command,
    user_message,  # noqa: F401  (re-exported)
)
from vitdense.core.errors import ConfigError
from vitdense.data.base import loader_key_hint
from vitdense.deploy.checkpoint import CLASS_PATH_KEY, Checkpoint, load_checkpoint, locate
from vitdense.deploy.slicing import Slicing, check_sliceable
from vitdense.tasks import BaseTask
from vitdense.trainer import Trainer

#: `--ckpt_path` values Lightning resolves itself (from the checkpoint callbacks)
SPECIAL_CKPT_PATHS = ("last", "best", "hpc")
#: what the data decides and a checkpoint restores when the config leaves it unset
DATA_DECIDED = ("mean", "std", "categories", "thing_ids", "classes")


def _is_file_path(ckpt_path: str | None) -> bool:
    """`ckpt_path` names a file (not one Lightning resolves itself: last, best, a registry)."""
    return ckpt_path is not None and ckpt_path not in SPECIAL_CKPT_PATHS and not ckpt_path.startswith("registry")


def _option(argv: list[str], name: str) -> str | None:
    """The value of `--name value` or `--name=value` in `argv`, or None."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _config_files(argv: list[str]) -> list[Path]:
    """The existing files given as `-c`/`--config` in `argv` (a config may also be given
    inline, as a YAML or JSON string)."""
    values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("-c", "--config")]
    values += [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
    return [Path(v) for v in values if "\n" not in v and not v.lstrip().startswith("{") and Path(v).is_file()]


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (YAML keeps the last one
    silently: two tasks named alike in a MultiTask config would become one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice in one mapping", key_node.start_mark
                )
            seen[key] = True
        return super().construct_mapping(node, deep=deep)


def _check_yaml(path: Path) -> None:
    """One line naming the file, line and column for a config that is not valid YAML, or that
    gives a key twice in one mapping (jsonargparse's own message names neither the file nor,
    often, the line)."""
    try:
        yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML ({getattr(err, 'problem', None) or err}{where})") from err


class VitDenseParser(LightningArgumentParser):
    """jsonargparse's parser, whose errors (unknown key, wrong type, bad value) are the
    message alone, not a hundred lines of usage first."""

    def error(self, message: str, ex: Exception | None = None) -> None:
        message = loader_key_hint(message)
        print(
            f"vitdense: error: {message.strip()}\n(options: python -m vitdense {{fit,validate,test,predict,export,serve,combine}} --help)",
            file=sys.stderr,
        )
        raise SystemExit(2)


#: settings the data decides, linked into the task: {the task's key: where to set it instead}
LINKED = {
    "num_classes": "the data's classes (data.init_args)",
    "class_names": "the data's classes (data.init_args)",
    "ignore_index": "the data's ignore_index (data.init_args.ignore_index)",
}


class VitDenseCLI(LightningCLI):
    #: the `--ckpt_path` checkpoint of validate/test/predict (None: none, or one Lightning resolves)
    checkpoint: Checkpoint | None = None

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict, subparser_kwargs: dict) -> None:
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
        # jsonargparse calls them "python -m vitdense [options] fit", which reads as if the
        # options went before the command
        for name, subcommand_parser in getattr(self, "_subcommand_parsers", {}).items():
            subcommand_parser.prog = f"{PROG} {name}"
        predict = getattr(self, "_subcommand_parsers", {}).get("predict")
        if predict is not None:
            predict.add_argument(
                "--slicing",
                type=Optional[Slicing],  # noqa: UP045 (jsonargparse reads the typing form)
                default=None,
                help="predict predict_dir's images in overlapping tiles merged as SAHI merges them (detection, "
                "instance segmentation; vitdense.deploy.slicing), e.g. --slicing.slice_height 512",
            )

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("model.init_args.backbone.name", "data.init_args.backbone", apply_on="parse")
        parser.link_arguments("data.img_size", "model.init_args.backbone.img_size", apply_on="instantiate")
        for name in ("num_classes", "class_names"):
            parser.link_arguments(
                f"data.{name}",
                f"model.init_args.{name}",
                compute_fn=partial(self._classes_from_data, name),
                apply_on="instantiate",
            )

    def _classes_from_data(self, name: str, value: Any) -> Any:
        """The data's classes for the task; a checkpoint's when the data does not know them
        (a folder of photos), and a clear error when the two disagree on the count."""
        if self.checkpoint is None:
            return value
        recorded = self.checkpoint.task.get(name)
        if value is None:
            return recorded
        if name == "num_classes" and recorded is not None and value != recorded:
            raise ConfigError(
                f"ckpt_path {self.checkpoint.path} was trained on {self.checkpoint.describe_classes()}, but the "
                f"data has {value}; predict or test on data with the checkpoint's classes, or fine-tune from it "
                f"with model.init_args.backbone.checkpoint"
            )
        return value

    def parse_arguments(self, parser, args) -> None:
        argv = list(sys.argv[1:] if args is None else args) if not isinstance(args, dict) else None
        #: the command line as the user gave it (before a checkpoint's config is added)
        self._argv = list(argv or [])
        ckpt_path = _option(argv, "--ckpt_path") if argv and argv[0] in ("validate", "test", "predict") else None
        if _is_file_path(ckpt_path):
            self.checkpoint = Checkpoint(ckpt_path)
            given = ("-c", "--config", "--model", "--data")
            if not any(arg == g or arg.startswith(g + "=") for arg in argv for g in given):
                argv = [argv[0], "--config", self.checkpoint.config(), *argv[1:]]
            args = argv
        for config in _config_files(argv or []):
            _check_yaml(config)
        if argv and any(a.split("=")[0] in ("--data.init_args.backbone", "--data.backbone") for a in argv):
            raise ConfigError(
                "data.init_args.backbone: the data normalises as the model's encoder "
                "(model.init_args.backbone.name, linked) was pretrained; set data.init_args.mean and std instead"
            )
        with warnings.catch_warnings():
            # the command line's own arguments, rewritten here (a checkpoint's config added): the
            # "both args and sys.argv" warning would blame the user for what vitdense did
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
            super().parse_arguments(parser, args)
        self._refuse_linked_settings()
        if self.checkpoint is not None:
            self._check_against_checkpoint()
        self._check_ckpt_path()

    def _parse_ckpt_path(self) -> None:
        """The checkpoint's recorded task settings, for what the user leaves unset.

        Lightning's own `_parse_ckpt_path` puts them over the whole parsed configuration, so
        that what a user asks for at `test` or `predict` (a crop, a depth cap, the kind of
        segmentation) would be dropped without a word. Here what the user gives — in a
        config file's `model` section or as `--model.…` — wins for the task's
        `evaluation_settings`; a different value for any other recorded setting (the
        architecture and the training, fixed once trained) is refused, naming the key."""
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else None
        ckpt_path = config.get("ckpt_path") if config is not None else None
        if not _is_file_path(ckpt_path) or not Path(ckpt_path).is_file():
            return
        if self.checkpoint is not None:
            hparams = copy.deepcopy({CLASS_PATH_KEY: self.checkpoint.task_class, **self.checkpoint.task})
        else:  # (fit resuming: a file _check_ckpt_path has loaded once already)
            ckpt = load_checkpoint(ckpt_path)
            hparams = dict(ckpt.get("hyper_parameters", {}) if isinstance(ckpt, dict) else {})
        hparams.pop("_instantiator", None)
        if not hparams:
            return
        task_class = _import(hparams.get(CLASS_PATH_KEY)) or _import((config.get("model") or {}).get("class_path"))
        changeable = set(getattr(task_class, "evaluation_settings", ()))
        init = (config.get("model") or {}).get("init_args")
        for key in sorted(_given_model_settings(self._argv)):
            recorded = _lookup(hparams, key)
            if init is None or recorded is _MISSING:
                continue
            given = _lookup(init, key)
            if key.split(".")[0] in changeable:
                _drop(hparams, key)  # the user's value stays in the configuration
            elif given is not _MISSING and not _same_setting(key, given, recorded):
                raise ConfigError(
                    f"model.init_args.{key}={_plain(given)!r}: ckpt_path {ckpt_path} was trained with "
                    f"{_plain(recorded)!r}, which cannot change after training; remove it (what may change at "
                    f"{subcommand}: {', '.join(sorted(changeable)) or 'nothing'})"
                )
        if CLASS_PATH_KEY in hparams:
            hparams = {"class_path": hparams.pop(CLASS_PATH_KEY), "dict_kwargs": hparams}
        self.config = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)

    def _check_ckpt_path(self) -> None:
        """A `ckpt_path` of any subcommand (`fit` resumes from it), from the command line or a
        config, must load: Lightning reads its hyperparameters next, and a file that is not a
        checkpoint would end there in an unpickling traceback rather than one line."""
        config = self.config[self.config.subcommand] if self.config.get("subcommand") else self.config
        ckpt_path = config.get("ckpt_path")
        if self.checkpoint is None and _is_file_path(ckpt_path):
            load_checkpoint(ckpt_path)

    def _refuse_linked_settings(self) -> None:
        """A value the user gives for a setting the data decides would be silently replaced
        by the link: refuse it, naming where it comes from."""
        config = self.config[self.config.subcommand] if self.config.get("subcommand") else self.config
        model = config.get("model")
        init = model.get("init_args") if model is not None else None
        if init is None:
            return
        defaults = _init_defaults(model.get("class_path"))
        for key, source in LINKED.items():
            # a value equal to the task's own default is the parser filling it in, not the user's
            if init.get(key) is not None and init.get(key) != defaults.get(key):
                raise ConfigError(
                    f"model.init_args.{key}={init.get(key)!r}: the task takes it from {source}; remove it from "
                    "the model's settings"
                )
        backbone = init.get("backbone")
        if backbone is not None and backbone.get("img_size") is not None:
            raise ConfigError(
                f"model.init_args.backbone.img_size={backbone.get('img_size')}: the encoder's size is "
                "data.init_args.img_size (linked); set that instead"
            )

    def _check_against_checkpoint(self) -> None:
        """The config's task must be the checkpoint's; what the data decided at training
        (normalisation, categories) fills what the config leaves unset."""
        config = self.config[self.config.subcommand]
        ckpt = self.checkpoint
        model_class = config.model.class_path if config.model is not None else None
        if model_class is not None and model_class.rsplit(".", 1)[-1] != ckpt.task_class.rsplit(".", 1)[-1]:
            raise ConfigError(
                f"ckpt_path {ckpt.path} is a checkpoint of {ckpt.task_class}, but the config's model is "
                f"{model_class}; use the config it was trained with, or leave --config out to take task and "
                "data from the checkpoint"
            )
        data = config.data
        if data is not None and ckpt.data_class is not None and _same_class(data.class_path, ckpt.data_class):
            for key in DATA_DECIDED:
                if key in ckpt.data and data.init_args.get(key) is None:
                    data.init_args[key] = ckpt.data[key]

    def before_instantiate_classes(self) -> None:
        self._link_ignore_index()
        self._no_weights_file_under_a_checkpoint()

    def _no_weights_file_under_a_checkpoint(self) -> None:
        """With a `ckpt_path` file, the checkpoint's weights replace the backbone's starting
        weights: its `backbone.checkpoint` (from the config or the checkpoint's recorded
        hyperparameters) is not read (not unpickled because a shipped checkpoint names it, and
        not needed once it has moved)."""
        config = self.config[self.config.subcommand] if self.config.get("subcommand") else self.config
        if not _is_file_path(config.get("ckpt_path")):
            return
        backbone = (config.get("model") or {}).get("init_args", {}).get("backbone")
        if backbone is not None and backbone.get("checkpoint") is not None:
            backbone["checkpoint"], backbone["trust_checkpoint"] = None, False

    def _link_ignore_index(self) -> None:
        """The data's `ignore_index` into a task that takes one (segmentation). Not a parser
        link: jsonargparse would hand it to every task, also those without the argument."""
        config = self.config[self.config.subcommand] if self.config.get("subcommand") else self.config
        model, data = config.get("model"), config.get("data")
        if model is None or data is None or "ignore_index" not in _init_defaults(model.get("class_path")):
            return
        data_init = data.get("init_args") or {}
        value = (
            data_init.get("ignore_index")
            if "ignore_index" in data_init
            else _class_attribute(data.get("class_path"), "ignore_index")
        )
        if value is not None:
            model.init_args.ignore_index = value

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
            self._set_up_slicing()
        except Exception as err:
            if (user_error := _user_error(err)) is None:
                raise
            _exit_with(user_error)

    def _set_up_slicing(self) -> None:
        """`predict --slicing.*`: the folder's images predicted in tiles (refused now, before any
        image is read, for a task without objects or without a folder)."""
        if self.config.get("subcommand") != "predict" or self.config_init.predict.get("slicing") is None:
            return
        slicing = self.config_init.predict.slicing
        check_sliceable(self.model)
        if getattr(self.datamodule, "predict_dir", None) is None:
            raise ConfigError("--slicing: sliced prediction reads a folder of images; give it as --data.predict_dir")
        self.datamodule.predict_slicing = slicing


def _import(class_path: str | None) -> type | None:
    """The class at `class_path`, or None if it cannot be imported."""
    if not class_path:
        return None
    try:
        return locate(class_path)
    except (ImportError, AttributeError, ValueError):
        return None


def _same_class(a: str, b: str) -> bool:
    """Two class paths name one class ("vitdense.data.X" and "vitdense.data.x.X": a checkpoint
    saved from Python records the defining module's)."""
    return a == b or (_import(a) is not None and _import(a) is _import(b))


def _init_defaults(class_path: str | None) -> dict[str, Any]:
    """A class's constructor arguments with their defaults (`inspect.Parameter.empty` where
    none), by name; {} if it cannot be imported."""
    cls = _import(class_path)
    return {} if cls is None else {k: p.default for k, p in inspect.signature(cls).parameters.items()}


def _class_attribute(class_path: str | None, name: str) -> Any:
    return getattr(_import(class_path), name, None)


#: a key a mapping does not have
_MISSING = object()


def _given_model_settings(argv: list[str]) -> set[str]:
    """The task settings the user gave, as dotted names under the model's `init_args`
    (`crop`, `backbone.name`, `head.init_args.num_layers`): a config file's `model` section
    (or a `--model` file), and `--model.init_args.…` / `--model.…` on the command line."""
    given: set[str] = set()
    sections = [(yaml.safe_load(f.read_text()) or {}).get("model") for f in _config_files(argv)]
    model_file = _option(argv, "--model")
    if model_file is not None and Path(model_file).is_file():
        sections.append(yaml.safe_load(Path(model_file).read_text()))
    for section in sections:
        if isinstance(section, dict):
            init = {k: v for k, v in section.items() if k not in ("class_path", "init_args", "dict_kwargs")}
            init.update(section.get("init_args") or {})
            given |= set(_dotted(init))
    for arg in argv:
        if arg.startswith("--model."):
            name = arg[len("--model.") :].split("=", 1)[0]
            given.add(name.removeprefix("init_args."))
    return given


def _dotted(values: dict[str, Any], prefix: str = "") -> list[str]:
    """The dotted names of a nested mapping's leaves (`{"a": {"b": 1}}` -> ["a.b"])."""
    names = []
    for key, value in values.items():
        if isinstance(value, dict) and value:
            names += _dotted(value, f"{prefix}{key}.")
        else:
            names.append(f"{prefix}{key}")
    return names


def _lookup(values: Any, dotted: str) -> Any:
    """`values` at a dotted name, through mappings and namespaces; `_MISSING` where absent."""
    for part in dotted.split("."):
        if hasattr(values, "as_dict"):  # a jsonargparse Namespace
            values = values.as_dict()
        if not isinstance(values, dict) or part not in values:
            return _MISSING
        values = values[part]
    return values


def _drop(values: dict[str, Any], dotted: str) -> None:
    """Remove a dotted name from a nested mapping (nothing if it is absent)."""
    *parents, last = dotted.split(".")
    for part in parents:
        values = values.get(part) if isinstance(values, dict) else None
    if isinstance(values, dict):
        values.pop(last, None)


def _plain(value: Any) -> Any:
    """A setting as plain data, for comparing and for messages (namespaces, dataclasses and
    tuples as dicts and lists)."""
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _same_setting(key: str, a: Any, b: Any) -> bool:
    """The user's and the checkpoint's values of `key` say the same (a class path may name
    its class through another module: `vitdense.heads.EoMTHead`, `vitdense.heads.eomt.EoMTHead`)."""
    a, b = _plain(a), _plain(b)
    if key.endswith("class_path") and isinstance(a, str) and isinstance(b, str):
        return _same_class(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return all(_same_setting(f"{key}.{k}", a[k], b[k]) for k in a if k in b)
    return a == b


def _user_error(err: BaseException) -> BaseException | None:
    """The innermost error of the user's making in `err`'s chain (jsonargparse wraps what a
    class raises while it is instantiated in its own ValueError), or None."""
    found = None
    while err is not None:
        if isinstance(err, USER_ERRORS):
            found = err
        err = err.__cause__ or err.__context__
    return found


class MultiTaskCLI(VitDenseCLI):
    """The command line of a `MultiTask` (several tasks on one encoder): each task names
    its classes and encoder size itself (`tasks.<name>.init_args`), checked against its
    DataModule at setup; the data normalises as the first task's encoder was pretrained."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments(
            "model.init_args.tasks", "data.init_args.backbone", _first_backbone_name, apply_on="parse"
        )

    def _refuse_linked_settings(self) -> None:
        pass  # (nothing is linked into the tasks)


def _first_backbone_name(tasks: Any) -> str | None:
    """The encoder name of a MultiTask's first task, as parsed (class_path + init_args)."""
    for spec in (tasks or {}).values():
        init = spec.get("init_args") if hasattr(spec, "get") else None
        backbone = init.get("backbone") if init is not None else None
        return getattr(backbone, "name", None) if not hasattr(backbone, "get") else backbone.get("name")
    return None


def _names_multitask(argv: list[str]) -> bool:
    """Whether the config files (or a --model given as a class path) name a `MultiTask`."""
    from vitdense.heads.factory import locate

    paths = [_option(argv, "--model"), _option(argv, "--model.class_path")]
    for config in _config_files(argv):
        try:
            loaded = yaml.safe_load(config.read_text()) or {}
        except yaml.YAMLError:
            continue  # (the command line names the file, line and column of a bad YAML: _check_yaml)
        model = loaded.get("model") if isinstance(loaded, dict) else None
        paths.append(model.get("class_path") if isinstance(model, dict) else None)
    for path in paths:
        if isinstance(path, str) and "." in path and not path.lstrip().startswith("{"):
            try:
                from vitdense.tasks.multitask import MultiTask

                if issubclass(locate(path), MultiTask):
                    return True
            except (ImportError, AttributeError, TypeError):
                continue
    return False


def main(args: list[str] | None = None) -> VitDenseCLI | None:
    """Run the CLI; `args` as on the command line (tests pass a list)."""
    argv = sys.argv[1:] if args is None else list(args)
    if argv in HELP_ARGS:
        print_top_level_help(argv)
    if argv and argv[0] in COMMANDS:
        return run_command(argv[0], argv[1:])
    try:
        with warnings.catch_warnings():
            # the tasks' default optimizer and schedule are functools.partial objects, which
            # jsonargparse cannot write into the saved config.yaml (it keeps the rest); nothing to act on
            warnings.filterwarnings("ignore", message=r"\s*Unable to serialize instance functools.partial")
            # Lightning's own use of a torch API that newer torch deprecates
            warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
            multitask = _names_multitask(argv)
            if multitask:
                from vitdense.tasks.multitask import MultiTask
            return (MultiTaskCLI if multitask else VitDenseCLI)(
                MultiTask if multitask else BaseTask,
                L.LightningDataModule,
                subclass_mode_model=True,
                subclass_mode_data=True,
                trainer_class=Trainer,
                args=args,
                save_config_kwargs={"overwrite": True},
                parser_class=VitDenseParser,
                parser_kwargs={"prog": PROG, "description": DESCRIPTION},
                seed_everything_default=0,  # every recipe's seed; a run from a checkpoint alone gets it too
            )
    except USER_ERRORS as err:  # e.g. bad data at setup
        _exit_with(err)
