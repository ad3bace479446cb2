"""The import graph of ``jaxmodel`` and ``hw_db`` (parsed with ``ast``, nothing imported).

Layering (docs/architecture.md, "Data flows one way"): a module may import modules of its own
layer or of lower layers, never of a higher one, and the graph has no cycle — counting imports
inside functions too (a late import hides a cycle from Python, not from the design). The
library imports its own modules at module level only (a function-level import is how a cycle
or an upward dependency hides), except in the applications and the lazily loaded search
package (:data:`LATE_IMPORTS_ALLOWED`); and since importing ``a.b.c`` first runs ``a/b/__init__``,
the module-level graph with those package initialisations has no cycle either.

====  =================================================================================
rank  layer
====  =================================================================================
0     ``jaxmodel.types`` (with ``jaxmodel.codes`` and ``jaxmodel.ranges``),
      ``jaxmodel.numerics``, ``jaxmodel.process``,
      ``jaxmodel.tech_tables``, ``jaxmodel.anchors``,
      ``jaxmodel.serving_runtime`` (pytrees, NaN-free helpers, process settings, the sourced
      ``hw_db/tech`` tables read by path, the anchors' folder, the serving runtimes' presets),
      ``hw_db._toml`` (hw_db's TOML reader: imports nothing of ours)
0.1   ``hw_db`` — the data and its loaders: they build and validate ``types`` objects and
      import nothing else of ours (the operator models' device checks reach them through
      ``types.register_device_check``); its *files* are data any layer may read by path
0.5   ``jaxmodel.precisions`` (numeric formats: a config pytree over ``types``),
      ``jaxmodel.speculative`` (speculative-decoding proposers: a config pytree over ``types``)
0.6   ``jaxmodel.recipes`` (the frameworks' named settings, their precisions included)
1     ``jaxmodel.batching`` (the API edge every formula module decorates with),
      ``jaxmodel.distributed`` (shares and gathers of a multi-process job)
2     ``jaxmodel.ops``, ``jaxmodel.comm`` (one device; the network)
2.7   ``jaxmodel.parallel.plan``, ``jaxmodel.parallel.pipeline`` (the plan's rules, the
      placement of its groups and the schedules' counts: the workload checks its layer
      split with them, so they sit below it)
3     ``jaxmodel.workload`` (layer op lists, memory, MoE)
4     ``jaxmodel.parallel`` (pipeline, training step, inference, GEMM tables)
4.5   ``jaxmodel.energy`` (device power and energy per token of a step or a request batch)
5     ``jaxmodel.cost`` (area, chiplet, device, TCO, micro-architecture)
5.5   ``jaxmodel.serving`` (serving systems in steady state, on ``parallel.inference_step``),
      ``jaxmodel.export`` (a plan as a framework's launch command)
6     ``jaxmodel.search`` (sweeps, parallelism search, co-design)
6.5   ``jaxmodel.explain`` (elasticities and bottleneck view over any of the above)
7     ``jaxmodel`` (the package façade re-exporting the public API)
7.5   ``jaxmodel.plan_io`` (the applications' shared helpers: plans in, JSON-ready answers out)
8     ``jaxmodel.cli``, ``jaxmodel.demo``, ``jaxmodel.plots`` (applications and reports),
      ``jaxmodel.__main__`` (``python -m jaxmodel``)
====  =================================================================================
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("jaxmodel", "hw_db")

RANKS = {
    "jaxmodel.types": 0, "jaxmodel.codes": 0, "jaxmodel.ranges": 0, "jaxmodel.numerics": 0, "jaxmodel.process": 0,
    "jaxmodel.tech_tables": 0, "jaxmodel.anchors": 0,
    "jaxmodel.precisions": 0.5, "jaxmodel.speculative": 0.5, "jaxmodel.recipes": 0.6,
    "jaxmodel.serving_runtime": 0,
    "jaxmodel.batching": 1, "jaxmodel.jitting": 1, "jaxmodel.distributed": 1,
    "jaxmodel.ops": 2, "jaxmodel.comm": 2,
    "hw_db": 0.1, "hw_db._toml": 0,
    "jaxmodel.parallel.plan": 2.7, "jaxmodel.parallel.pipeline": 2.7,
    "jaxmodel.workload": 3,
    "jaxmodel.parallel": 4,
    "jaxmodel.energy": 4.5,
    "jaxmodel.cost": 5,
    "jaxmodel.serving": 5.5, "jaxmodel.export": 5.5,
    "jaxmodel.search": 6,
    "jaxmodel.explain": 6.5,
    "jaxmodel": 7, "jaxmodel.plan_io": 7.5,
    "jaxmodel.cli": 8, "jaxmodel.demo": 8, "jaxmodel.plots": 8, "jaxmodel.ui": 8,
    "jaxmodel.__main__": 8,
}


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


def _resolve(name: str, mods: dict) -> str | None:
    """The module (or package) of ours that ``name`` refers to, else None."""
    while name:
        if name in mods:
            return name
        name = name.rpartition(".")[0]
    return None


#: Modules that may import modules of ours inside functions: the applications (their
#: subcommands load what they use) and the search package (pandas / optax load on first use).
LATE_IMPORTS_ALLOWED = ("jaxmodel.cli", "jaxmodel.demo", "jaxmodel.plots", "jaxmodel.search",
                        "jaxmodel.ui")


def _module_level(tree: ast.Module):
    """The statements Python runs when it imports the module (not inside a def or class)."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


@functools.lru_cache(maxsize=None)
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _imports(mod: str, path: Path, mods: dict, where: str = "anywhere") -> set[str]:
    """Modules of ours imported in ``path``: ``where`` = ``"anywhere"`` (module level and inside
    functions), ``"module"`` (at import time) or ``"functions"`` (inside functions only)."""
    tree = _parse(path)
    is_pkg = path.name == "__init__.py"
    out = set()
    nodes = list(ast.walk(tree))
    if where != "anywhere":
        top = {id(n) for n in _module_level(tree)}
        nodes = [n for n in nodes if (id(n) in top) == (where == "module")]
    for node in nodes:
        if isinstance(node, ast.Import):
            for a in node.names:
                target = _resolve(a.name, mods)
                if target:
                    out.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".")
                base = base if is_pkg else base[:-1]
                base = base[:len(base) - (node.level - 1)]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            for a in node.names:
                # "from pkg import sub" imports the submodule when there is one
                target = _resolve(f"{src}.{a.name}", mods) if f"{src}.{a.name}" in mods \
                    else _resolve(src, mods)
                if target:
                    out.add(target)
    out.discard(mod)
    return out


def _rank(mod: str) -> float:
    name = mod
    while name not in RANKS:
        name = name.rpartition(".")[0]
        assert name, f"{mod} has no layer: add it to RANKS in {Path(__file__).name}"
    return RANKS[name]


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p, mods) for m, p in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out



def test_every_module_has_a_layer():
    for mod in _modules():
        _rank(mod)


def test_graph_is_read():
    """The parser sees the imports it must see (guards the checks below against passing on
    an empty graph)."""
    g = _graph()
    assert "jaxmodel.batching" in g["jaxmodel.ops.gemm"]
    assert "jaxmodel.types" in g["hw_db"]
    assert "hw_db._toml" in g["jaxmodel.tech_tables"]
    assert "jaxmodel.search.grid" in g["jaxmodel.search.explore"]
    assert sum(len(v) for v in g.values()) > 100


def test_hw_db_imports_only_types():
    """The loaders depend on the pytrees alone (and on their own TOML reader)."""
    g = _graph()
    assert g["hw_db"] == {"jaxmodel.types", "hw_db._toml"}
    assert g["hw_db._toml"] == set()


def test_no_upward_import():
    g = _graph()
    bad = sorted(f"{m} (layer {_rank(m)}) imports {t} (layer {_rank(t)})"
                 for m, ts in g.items() for t in ts if _rank(t) > _rank(m))
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_no_import_cycle():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles: " + "; ".join(" ↔ ".join(c) for c in cycles)


def _parents(mod: str, mods: dict) -> set[str]:
    """The packages whose ``__init__`` Python runs before ``mod`` (``jaxmodel`` excluded:
    every module of ours runs under it)."""
    parts = mod.split(".")
    return {".".join(parts[:k]) for k in range(2, len(parts))} & set(mods)


def test_no_import_inside_functions():
    mods = _modules()
    bad = sorted(f"{m} imports {', '.join(sorted(ts))} inside a function"
                 for m, p in mods.items()
                 if not any(m == a or m.startswith(a + ".") for a in LATE_IMPORTS_ALLOWED)
                 for ts in [_imports(m, p, mods, where="functions")] if ts)
    assert not bad, "\n".join(bad)


def test_no_cycle_at_import_time():
    """Module-level imports plus the package ``__init__`` each import runs first: what
    Python executes on ``import jaxmodel``."""
    mods = _modules()
    graph = {}
    for m, p in mods.items():
        targets = _imports(m, p, mods, where="module")
        graph[m] = (targets | {q for t in targets for q in _parents(t, mods)}) - {m} \
            - _parents(m, mods)
    cycles = _cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" ↔ ".join(c) for c in cycles)


def test_import_checks_see_function_level_imports():
    """The two checks above read what they must: a late import is seen as one, the package
    initialisation an import runs is counted."""
    tree = ast.parse("import os\nfrom jaxmodel import ops\n"
                     "def f():\n    from jaxmodel import comm\n")
    top = {id(n) for n in _module_level(tree)}
    late = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and id(n) not in top]
    assert [n.names[0].name for n in late] == ["comm"]
    assert _parents("jaxmodel.parallel.plan", _modules()) == {"jaxmodel.parallel"}


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
