"""No import cycle between the project's modules, counting every import: module level, inside functions and
under TYPE_CHECKING (docs/architecture.md, "Layers"). A lazy import hides a cycle from Python, not from a reader."""
from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("stylevar", "training", "serve", "web", "benchmarks", "data_tools")


def module_files(repo: Path, roots: Iterable[str]) -> dict[str, Path]:
    """Dotted module name -> source file, for every .py under the roots (a package is its __init__.py)."""
    found = {}
    for root in roots:
        for path in sorted((repo / root).rglob("*.py")):
            parts = path.relative_to(repo).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _targets(module: str, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> set[str]:
    """The project modules one import statement names (the longest known prefix of each dotted name)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if modules[module].name == "__init__.py" else module.split(".")[:-1]
            package = package[:len(package) - node.level + 1]
            base = ".".join(package + ([node.module] if node.module else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    out = set()
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name != module:
            out.add(name)
    return out


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        graph[module] = set().union(*(_targets(module, n, modules) for n in ast.walk(tree)
                                      if isinstance(n, (ast.Import, ast.ImportFrom))))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def describe(component: list[str], graph: dict[str, set[str]]) -> str:
    members = set(component)
    edges = [f"    {a} -> {b}" for a in component for b in sorted(graph[a] & members)]
    return "a cycle of " + ", ".join(component) + ":\n" + "\n".join(edges)


# the library's layers, bottom to top (docs/architecture.md, "Layers"): a package imports only packages of its own
# row and below; inside a package any module may import another (the cycle test below still holds there)
LIBRARY_LAYERS = (
    ("config", "utils"),
    ("models",),
    ("processing",),
    ("loaders",),
    ("metrics", "pipelines"),
    ("baselines", "runtime"),
    ("evaluate",),
    ("cli", "evaluate.__main__"),  # the entry points
)


def _part(module: str) -> str | None:
    """The layer name of a stylevar module: its package below stylevar, or `config` (evaluate's entry point by
    itself)."""
    parts = module.split(".")
    if module == "stylevar.evaluate.__main__":
        return "evaluate.__main__"
    return parts[1] if len(parts) > 1 else None


def test_the_library_imports_down_its_layers():
    rank = {name: i for i, row in enumerate(LIBRARY_LAYERS) for name in row}
    modules = module_files(REPO, ["stylevar"])
    unplaced = sorted(m for m in modules if _part(m) is not None and _part(m) not in rank)
    assert not unplaced, f"give these modules a layer in LIBRARY_LAYERS (and docs/architecture.md): {unplaced}"
    upward = [f"{a} -> {b}" for a, targets in import_graph(modules).items() for b in sorted(targets)
              if None not in (_part(a), _part(b)) and rank[_part(b)] > rank[_part(a)]]
    assert not upward, "imports up the layers:\n" + "\n".join(upward)


def test_no_import_cycle_in_the_project():
    graph = import_graph(module_files(REPO, ROOTS))
    found = cycles(graph)
    assert not found, "\n".join(describe(c, graph) for c in found)


def test_the_checker_finds_lazy_relative_and_package_cycles(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg import b\n")  # function-local
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n")
    (pkg / "sub" / "__init__.py").write_text("from .c import x\n")
    (pkg / "sub" / "c.py").write_text("from pkg.sub import y\nx = 1\n")  # a child importing its own package
    (pkg / "d.py").write_text("import pkg.a\nfrom pkg.sub.c import x\n")  # no cycle: only outgoing
    graph = import_graph(module_files(tmp_path, ["pkg"]))
    assert sorted(cycles(graph)) == [["pkg.a", "pkg.b"], ["pkg.sub", "pkg.sub.c"]]
