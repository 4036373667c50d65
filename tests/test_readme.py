"""README's code examples run as written: a new task, a new dataset (both reached from YAML
through the command line) and a trained model used from Python."""

import json
import re
import sys
import types
from pathlib import Path

import numpy as np
from PIL import Image

from vitdense.cli import main

README = Path(__file__).parents[1] / "README.md"


def code_blocks(section: str) -> list[str]:
    """The ```python blocks of README's section `{section}`, up to the next heading."""
    text = README.read_text()
    start = re.search(rf"^#+ {re.escape(section)}\n", text, re.M).start()
    end = min((m.start() for m in re.finditer(r"^#{1,3} ", text[start + 4 :], re.M)), default=len(text)) + start + 4
    blocks = re.findall(r"```python\n(.*?)```", text[start:end], re.S)
    assert blocks, f"README's section {section!r} has no python example"
    return blocks


def as_module(name: str, code: str, monkeypatch) -> types.ModuleType:
    """Run `code` as the module `name`, importable (YAML's class_path reaches its classes)."""
    module = types.ModuleType(name)
    monkeypatch.setitem(sys.modules, name, module)
    exec(compile(code, f"README.md ({name})", "exec"), module.__dict__)
    return module


def fast_fit(tmp_path: Path, model: dict, data: dict, *extra: str):
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"model": model, "data": data}))  # JSON is YAML
    args = ["fit", "--config", str(config), "--trainer.fast_dev_run=2", f"--trainer.default_root_dir={tmp_path}"]
    return main([*args, "--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false", *extra])


TINY = {"name": "vit_tiny_patch16_224", "model_args": {"depth": 1}}


def test_how_to_add_a_task(tmp_path, monkeypatch):
    (code,) = code_blocks("How to add a task")
    module = as_module("readme_task", code, monkeypatch)  # its own asserts run here
    data = {
        "class_path": "vitdense.data.SyntheticClassificationDataModule",
        "init_args": {"img_size": 32, "train_size": 8, "val_size": 4, "loader": {"batch_size": 4}},
    }
    model = {"class_path": "readme_task.F1Task", "init_args": {"backbone": TINY, "average": "micro"}}
    cli = fast_fit(tmp_path, model, data)
    assert isinstance(cli.model, module.F1Task) and cli.model.average == "micro"  # its own setting, from YAML
    assert cli.model.class_names == cli.datamodule.class_names  # linked from the data
    assert "val/f1" in cli.trainer.callback_metrics and "train/loss_ce" in cli.trainer.callback_metrics


def test_bringing_a_dataset(tmp_path, monkeypatch):
    (code,) = code_blocks("Bringing a dataset")
    monkeypatch.chdir(tmp_path)
    as_module("readme_data", code, monkeypatch)
    rng = np.random.default_rng(0)
    (tmp_path / "pets" / "images").mkdir(parents=True)
    for split, count in (("train", 8), ("val", 4), ("test", 4)):
        rows = []
        for i in range(count):
            name = f"{split}{i}.png"
            Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(tmp_path / "pets" / "images" / name)
            rows.append(f"{name},{('cat', 'dog')[i % 2]}")
        (tmp_path / "pets" / f"{split}.csv").write_text("\n".join(rows) + "\n")
    data = {
        "class_path": "readme_data.PetsDataModule",
        "init_args": {"root": str(tmp_path / "pets"), "img_size": 32, "loader": {"batch_size": 4, "num_workers": 0}},
    }
    model = {"class_path": "vitdense.tasks.ClassificationTask", "init_args": {"backbone": TINY}}
    cli = fast_fit(tmp_path, model, data)
    assert cli.model.class_names == ["cat", "dog"]  # linked from the example's DataModule
    assert cli.trainer.callback_metrics["val/acc1"] >= 0


def test_using_a_trained_model_from_python(trained, monkeypatch):
    (code,) = code_blocks("Using a trained model from Python")
    _, ckpt = trained["seg"]
    code = code.replace("runs/demo_seg/checkpoints/last.ckpt", str(ckpt))
    module = as_module("readme_model", code, monkeypatch)
    assert module.logits.shape[:2] == (2, module.model.num_classes)
    assert [tuple(x.shape) for x in module.labels] == [(64, 80), (48, 64)]


def test_backbone_example(monkeypatch):
    # the example builds ViT-B/16 three ways; offline, the one from timm's name alone runs
    (code, *_) = code_blocks("The backbone")
    lines = [line for line in code.splitlines() if "checkpoint=" not in line and "pretrained=True" not in line]
    module = as_module("readme_backbone", "\n".join(lines), monkeypatch)
    assert module.f.grid_size == (24, 32)


def headings() -> list[tuple[int, str]]:
    """README's headings as (level, text), code blocks left out (their `# comments` are not headings)."""
    found, fence = [], False
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"(#{1,6}) (.+)", line)):
            found.append((len(m[1]), m[2].strip()))
    return found


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def test_internal_links_name_a_heading():
    anchors = {anchor(text) for _, text in headings()}
    links = re.findall(r"\]\(#([^)]+)\)", README.read_text())
    assert links
    broken = sorted(set(links) - anchors)
    assert not broken, f"README links to #{broken}, which no heading of README has (anchors: lowercase, spaces -> -)"


def test_contents_lists_every_section():
    """The table of contents at the top links every `##` and `###` heading, in README's order."""
    text = README.read_text()
    contents = text[text.index("**Contents**") : text.index("\n## ")]
    listed = re.findall(r"^ *- \[.*\]\(#([^)]+)\)$", contents, re.M)
    sections = [anchor(heading) for level, heading in headings() if level in (2, 3)]
    assert listed == sections, "update README's Contents: it should link every ## and ### heading, in order"


def test_layout_names_every_module():
    """README's Layout table has a row for every package of vitdense/ naming each of its
    modules, a row for each module at the top, and names nothing that is gone."""
    text = README.read_text()
    start = text.index("\n## Layout\n")
    end = text.find("\n## ", start + 1)
    layout = text[start : end if end >= 0 else len(text)]
    rows = dict(re.findall(r"^\| `(vitdense/[^`]*)` \|(.*)\|$", layout, re.M))
    root = README.parent
    package = root / "vitdense"
    missing = []
    for folder in sorted({p.parent for p in package.rglob("__init__.py")} - {package}):
        name = folder.relative_to(root).as_posix() + "/"
        if name not in rows:
            missing.append(name)
            continue
        named = set(re.findall(r"`([\w]+\.py)`", rows[name]))
        missing += [
            f"{name}{p.name}" for p in sorted(folder.glob("*.py")) if p.name != "__init__.py" and p.name not in named
        ]
    missing += [
        p.relative_to(root).as_posix()
        for p in sorted(package.glob("*.py"))
        if p.relative_to(root).as_posix() not in rows
    ]
    assert not missing, f"add {missing} to README's Layout table (a package's row names each of its modules)"
    gone = sorted(name for name in rows if not (root / name).exists())
    gone += [
        f"{name}{m}"
        for name, row in rows.items()
        if name.endswith("/")
        for m in re.findall(r"`([\w]+\.py)`", row)
        if not (root / name / m).exists()
    ]
    assert not gone, f"README's Layout names {gone}, which no longer exist: remove or rename them there"
