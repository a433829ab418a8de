"""`pip install 'stylevar[app]'` brings what the service and its UI import: every third-party module that serve/
and web/ import (at the top or inside a function) belongs to a distribution that the core dependencies or the
`app` extra's extras (serve, web, video, teacher) name."""
from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]
FIRST_PARTY = {"stylevar", "serve", "web", "training", "data_tools", "tests", "benchmarks"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(requirements: list[str], extras: dict[str, list[str]]) -> set[str]:
    """The distributions ``requirements`` name, the project's own extras (`stylevar[a,b]`) expanded."""
    out = set()
    for requirement in requirements:
        name, _, rest = re.match(r"([A-Za-z0-9._-]+)(\[([\w,\s-]+)\])?", requirement).groups()
        if canonical(name) == "stylevar":
            for extra in rest.split(","):
                out |= requirement_names(extras[extra.strip()], extras)
        else:
            out.add(canonical(name))
    return out


def imported_modules(folders: list[str]) -> set[str]:
    """The top-level names of every absolute import in the folders' Python files."""
    names = set()
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return names


def test_the_app_extra_covers_every_import_of_the_service_and_the_ui():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert requirement_names(extras["app"], extras) >= requirement_names(["stylevar[serve,web,video,teacher]"], extras)
    provided = requirement_names(project["dependencies"] + extras["app"], extras)
    third_party = imported_modules(["serve", "web"]) - set(sys.stdlib_module_names) - FIRST_PARTY - {"__future__"}
    assert {"fastapi", "gradio", "fastapi_offline"} <= third_party  # the scan sees the service's and the UI's imports
    distributions = importlib.metadata.packages_distributions()
    unknown = sorted(m for m in third_party if m not in distributions)
    assert not unknown, f"imported but not installed here, so their distribution cannot be told: {unknown}"
    uncovered = {m: distributions[m] for m in third_party if not {canonical(d) for d in distributions[m]} & provided}
    assert not uncovered, f"imported by serve/ or web/ but in no requirement of stylevar[app]: {uncovered}"


def test_all_keeps_the_development_tools():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert requirement_names(extras["all"], extras) >= requirement_names(extras["app"] + extras["dev"], extras)
