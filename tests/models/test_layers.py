"""The package layers of docs/architecture.md, checked on the source: who may import whom.

stylevar (the library) imports none of the applications; web does not know serve; serve reaches web
only inside functions (the API runs without Gradio); training and data_tools stand on the library.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("stylevar", "serve", "web", "training", "data_tools")
MAY_IMPORT = {
    "stylevar": {"stylevar"},
    "web": {"web", "stylevar"},
    "serve": {"serve", "stylevar", "web"},
    "training": {"training", "stylevar", "data_tools"},
    "data_tools": {"data_tools", "stylevar"},
}
LAZY_ONLY = {("serve", "web")}  # imported inside a function or under TYPE_CHECKING, never at import time


def imports(path: Path) -> list[tuple[str, bool]]:
    """(top-level package, imported at module level) for each import of a project package in `path`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            type_only = isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
            if isinstance(child, ast.Import):
                found.extend((alias.name.split(".")[0], top) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.append((child.module.split(".")[0], top))
            visit(child, top and not nested and not type_only)

    visit(tree, True)
    return [(pkg, top) for pkg, top in found if pkg in PACKAGES]


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_imports_only_its_layer(package):
    wrong = []
    for path in sorted((REPO / package).rglob("*.py")):
        for target, top in imports(path):
            where = path.relative_to(REPO)
            if target not in MAY_IMPORT[package]:
                wrong.append(f"{where} imports {target}")
            elif top and (package, target) in LAZY_ONLY:
                wrong.append(f"{where} imports {target} at module level")
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_lazy_and_module_level_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import serve.http.app\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from web import x\n"
                   "def f():\n    from training import loop\n")
    assert imports(src) == [("serve", True), ("web", False), ("training", False)]
