"""The package says what it needs truthfully: every floor CI checks (.ci/floors.txt) is the
floor pyproject.toml declares, and the wheel carries the licence pyproject names."""

from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib")  # the standard library's from Python 3.11 (CI's)

ROOT = Path(__file__).parents[1]


def floors_in_pyproject() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors = {}
    for line in project["dependencies"]:
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == ">=", f"{line}: pyproject.toml keeps floors only (caps go to .ci/constraints.txt)"
        floors[req.name] = spec.version
    return floors


def test_ci_checks_the_floors_pyproject_declares():
    declared = floors_in_pyproject()
    checked = {}
    for line in (ROOT / ".ci" / "floors.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            (spec,) = req.specifier
            checked[req.name] = spec.version
    # pytorch-lightning is lightning's twin package, pinned alongside it
    assert checked.pop("pytorch-lightning") == checked["lightning"]
    for name, version in checked.items():
        assert declared[name] == version, f"{name}: pyproject.toml says >={declared[name]}, CI checks {version}"


def test_the_licence_file_is_the_one_pyproject_names():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    (licence,) = project["license-files"]
    text = (ROOT / licence).read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
