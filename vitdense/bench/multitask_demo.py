"""`python -m vitdense.bench multitask-demo`: configs/demo_multitask.yaml trained jointly against
each of its tasks trained alone, on the same co-annotated scenes, seed by seed.

For each seed the joint run is the demo itself (`python -m vitdense fit --config
configs/demo_multitask.yaml --seed_everything S`); each task alone is the same task (head,
loss, encoder, optimizer, schedule, epochs, batch) from the same generated rooms with only its
own labels (`SyntheticSceneLabelsDataModule(kind)`), so it takes as many steps as the joint run
and sees the same images. Printed per task: its validation figure after the last epoch, joint
and alone (mean and spread over the seeds), and at equal wall time: each alone run's figure
at its last validation within a third of the joint run's time (three tasks share the
joint run's time; that validation's schedule had not annealed, which favours joint). Every
run's time and seconds per step are printed with the CPU.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import yaml

from vitdense.bench.common import cpu_kind, spread

#: the figure printed per task: (joint key, alone key, higher is better)
FIGURES = {
    "det": ("val/det/map_50", "val/map_50", True),
    "seg": ("val/seg/mIoU", "val/mIoU", True),
    "depth": ("val/depth/abs_rel", "val/abs_rel", False),
}
#: task settings a single task's command line links from its data (given twice, it refuses them)
_LINKED = ("num_classes", "class_names")


def alone_config(config: dict[str, Any], name: str) -> dict[str, Any]:
    """The demo's task `name` alone: its model settings, the multi-task optimizer and schedule,
    and the scenes' labels of its kind."""
    multi = config["model"]["init_args"]
    task = {k: v for k, v in multi["tasks"][name]["init_args"].items() if k not in _LINKED}
    task["backbone"] = {k: v for k, v in task["backbone"].items() if k != "img_size"}  # (linked from the data)
    task |= {"optimizer": multi["optimizer"], "lr_scheduler": multi["lr_scheduler"]}
    data = dict(config["data"]["init_args"])
    kind = data.pop("labels", {}).get(name, name)
    return {
        **{k: v for k, v in config.items() if k not in ("model", "data")},
        "model": {"class_path": multi["tasks"][name]["class_path"], "init_args": task},
        "data": {"class_path": "vitdense.data.SyntheticSceneLabelsDataModule", "init_args": {"kind": kind, **data}},
    }


def run(config: dict[str, Any], folder: Path, seed: int, max_epochs: int | None) -> dict[str, Any]:
    """Fit `config` (in this process) into `folder`: {"seconds", "steps", "figures": [(seconds
    since the start, {key: value}) per validation]}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from vitdense.cli import main

    config = {**config, "seed_everything": seed}
    trainer = dict(config["trainer"]) | {
        "default_root_dir": str(folder),
        "callbacks": [],
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    if max_epochs is not None:
        trainer["max_epochs"] = max_epochs
    config["trainer"] = trainer
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    start = time.time()
    cli = main(["fit", "--config", str(path)])
    seconds = time.time() - start
    events = EventAccumulator(str(Path(cli.trainer.logger.log_dir)), size_guidance={"scalars": 0})
    events.Reload()
    by_step: dict[int, tuple[float, dict[str, float]]] = {}
    for key in events.Tags()["scalars"]:
        if key.startswith("val/"):
            for e in events.Scalars(key):
                by_step.setdefault(e.step, (e.wall_time - start, {}))[1][key] = e.value
    return {"seconds": seconds, "steps": cli.trainer.global_step, "figures": [by_step[s] for s in sorted(by_step)]}


def bench_multitask_demo(config_path: str, seeds: list[int], out: str, max_epochs: int | None = None) -> dict[str, Any]:
    """Every run of every seed: {"joint": [run per seed], name: [run per seed] ...}."""
    config = yaml.safe_load(Path(config_path).read_text())
    names = list(config["model"]["init_args"]["tasks"])
    runs: dict[str, list[dict[str, Any]]] = {"joint": [], **{name: [] for name in names}}
    for seed in seeds:
        runs["joint"].append(run(config, Path(out) / f"joint_{seed}", seed, max_epochs))
        for name in names:
            runs[name].append(run(alone_config(config, name), Path(out) / f"{name}_{seed}", seed, max_epochs))
    return runs


def print_multitask_demo(runs: dict[str, Any], seeds: list[int]) -> None:
    import torch

    from vitdense.core.precision import resolve_precision

    precision = resolve_precision("auto", "cpu").precision
    print(
        f"# multitask-demo: joint vs alone, seeds {seeds}; {cpu_kind()}, precision {precision}, torch {torch.__version__}"
    )
    joint = runs["joint"]
    print(
        "joint: "
        + ", ".join(f"seed {s}: {r['seconds']:.0f} s, {r['steps']} steps, {r['seconds'] / r['steps']:.3f} s/step"
                    for s, r in zip(seeds, joint, strict=True))
    )  # fmt: skip
    print(f"{'task':6} {'figure':14} {'joint':>18} {'alone (= steps)':>18} {'alone (= time)':>18}  alone s/step")
    for name, (joint_key, alone_key, _) in FIGURES.items():
        if name not in runs:
            continue
        alone = runs[name]
        final_joint = [r["figures"][-1][1].get(joint_key) for r in joint]
        final_alone = [r["figures"][-1][1].get(alone_key) for r in alone]
        budget = [j["seconds"] / (len(runs) - 1) for j in joint]  # the joint run's time, shared by its tasks
        at_time = []
        for r, limit in zip(alone, budget, strict=True):
            within = [figures.get(alone_key) for t, figures in r["figures"] if t <= limit]
            if within and within[-1] is not None:
                at_time.append(within[-1])
        per_step = statistics.fmean(r["seconds"] / r["steps"] for r in alone)
        print(
            f"{name:6} {alone_key.removeprefix('val/'):14} {spread([v for v in final_joint if v is not None]):>18} "
            f"{spread([v for v in final_alone if v is not None]):>18} {spread(at_time):>18}  {per_step:.3f}"
        )
