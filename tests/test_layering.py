"""The package's floors: no import points up a floor, and no import circle, over the whole of
gdn_export (every import counts: module level, inside functions, under TYPE_CHECKING). A unit is a
top-level module or subpackage of gdn_export; a unit may import units of its own floor or below,
and the units of one floor import each other without a circle.

    floor 0  errors, paths, config, hf_config, vision_config, layout, gdn_export/__init__
             (what everything names: errors, file checks, the model and deployment configs)
    floor 1  cuda        the CUDA extension loader of the plugins' kernels
    floor 2  ops         each op's contract: torch op, reference, kernels' wrappers, ONNX translation
    floor 3  modules     layers built from the ops
    floor 4  models      whole models built from the layers
    floor 5  weights     checkpoints -> models;   onnx    models -> graphs
    floor 6  runtime     runners of checkpoints and graphs, timing
    floor 7  trt         engines;   validate    parity reports;   quantize    quantized checkpoints;
             serve       the OpenAI-compatible server over the runners
    floor 8  vlm         the vision-language pieces of every verb above
    floor 9  cli, __main__

A circle among modules is found through imports of modules, not of packages: `from gdn_export.ops
import backends` is an import of gdn_export.ops.backends, and a module does not import the package
__init__ it lives in by being in it.

The top-level `kernels/` package (compute kernels by op, importable without gdn_export) imports
nothing of gdn_export; the check runs over whatever kernels/ holds, nothing while it does not exist.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gdn_export"
KERNELS = ROOT / "kernels"
FLOORS = {
    0: ("errors", "paths", "config", "hf_config", "vision_config", "layout", "__init__"),
    1: ("cuda",),
    2: ("ops",),
    3: ("modules",),
    4: ("models",),
    5: ("weights", "onnx"),
    6: ("runtime",),
    7: ("trt", "validate", "quantize", "serve"),
    8: ("vlm",),
    9: ("cli", "__main__"),
}
FLOOR = {unit: floor for floor, units in FLOORS.items() for unit in units}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules_of(root: Path) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def imports(path: Path, root: Path, known: dict[str, Path]):
    """(line, imported module) of every import in `path`: relative ones resolved, `from P import N`
    read as the module P.N where that is a module, else as P."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            subs = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in known]
            if len(subs) < len(node.names):
                yield node.lineno, module
            for sub in subs:
                yield node.lineno, sub


def graph(root: Path) -> dict[str, dict[str, int]]:
    """{module: {imported module of the same package: first line}}."""
    known = modules_of(root)
    out: dict[str, dict[str, int]] = {}
    for name, path in known.items():
        edges = out.setdefault(name, {})
        for line, target in imports(path, root, known):
            if target in known and target != name:
                edges.setdefault(target, line)
    return out


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def upward(module_graph: dict[str, dict[str, int]], floor: dict[str, int]) -> list[str]:
    return [f"{src} (floor {floor[unit_of(src)]}) imports {dst} (floor {floor[unit_of(dst)]}), line {line}"
            for src, targets in module_graph.items() for dst, line in targets.items()
            if floor[unit_of(dst)] > floor[unit_of(src)]]


def unit_graph(module_graph: dict[str, dict[str, int]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for src, targets in module_graph.items():
        out.setdefault(unit_of(src), set()).update(unit_of(d) for d in targets if unit_of(d) != unit_of(src))
    return out


GRAPH = graph(PACKAGE)


def test_every_unit_has_a_floor():
    units = {unit_of(m) for m in GRAPH}
    assert units - set(FLOOR) == set(), "declare the floor of each new unit in FLOORS (and the docstring)"
    assert {"cli", "ops", "runtime", "vlm"} <= units


@pytest.mark.parametrize("unit", sorted({unit_of(m) for m in GRAPH} & set(FLOOR)))
def test_no_import_points_up_a_floor(unit):
    bad = upward({m: t for m, t in GRAPH.items() if unit_of(m) == unit}, FLOOR)
    assert not bad, "\n".join(bad)


def test_no_circle_between_units():
    found = circles(unit_graph(GRAPH))
    assert not found, "unit circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_circle_between_modules():
    found = circles({m: set(t) for m, t in GRAPH.items()})
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize("path", sorted(KERNELS.rglob("*.py")) if KERNELS.is_dir() else [],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_kernels_import_nothing_of_gdn_export(path):
    bad = [m for _, m in imports(path, KERNELS, modules_of(KERNELS)) if m.split(".")[0] == "gdn_export"]
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}: kernels/ stands below gdn_export"


def test_the_scan_finds_an_upward_import_a_circle_and_a_lazy_import(tmp_path):
    """The checks above on a package made to break them: a function-level import up a floor, a
    relative import, a `from package import module` circle."""
    pkg = tmp_path / "gdn_export"
    for folder in ("ops", "cli"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "ops" / "a.py").write_text("def f():\n    from gdn_export.cli import main\n")
    (pkg / "cli" / "main.py").write_text("from . import other\n")
    (pkg / "cli" / "other.py").write_text("from gdn_export.cli import main\n")
    g = graph(pkg)
    assert upward(g, FLOOR) == ["gdn_export.ops.a (floor 2) imports gdn_export.cli.main (floor 9), line 2"]
    assert circles({m: set(t) for m, t in g.items()}) == [["gdn_export.cli.main", "gdn_export.cli.other"]]
    assert circles(unit_graph(g)) == []


def test_the_scan_sees_the_package():
    assert len(GRAPH) > 150
    assert "gdn_export.errors" in GRAPH["gdn_export.ops.backends"]
    assert "gdn_export.cli.vlm" in GRAPH["gdn_export.cli.run"]


def test_the_cuda_backend_is_each_ops_own_wrapper():
    """The `cuda` backend's entries are the wrappers beside each op, found without building anything."""
    from gdn_export.ops import backends

    b = backends.get("cuda")
    assert {f.__module__ for f in (b.gated_delta_rule, b.gated_delta_rule_inplace, b.gated_delta_rule_fast,
                                   b.gated_delta_rule_inplace_fast, b.causal_conv1d, b.moe)} == {
        "gdn_export.ops.gated_delta_rule.cuda", "gdn_export.ops.causal_conv1d.cuda", "gdn_export.ops.moe.cuda"}
