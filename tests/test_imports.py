"""The import graph of ``jaxmodel`` and ``hw_db`` (parsed with ``ast``, nothing imported).

Layering (docs/architecture.md, "Data flows one way"): a module may import modules of its own
layer or of lower layers, never of a higher one, and the graph has no cycle — counting imports
inside functions too (a late import hides a cycle from Python, not from the design).

====  =================================================================================
rank  layer
====  =================================================================================
0     ``jaxmodel.types``, ``jaxmodel.numerics``, ``jaxmodel.runtime``,
      ``jaxmodel.tech_tables``, ``jaxmodel.recipes`` (pytrees, NaN-free helpers, process
      settings, the sourced ``hw_db/tech`` tables read by path, the frameworks' named
      settings: no jaxmodel imports)
0.5   ``jaxmodel.precision`` (numeric formats: a config pytree over ``types``)
1     ``jaxmodel.batching`` (the API edge every formula module decorates with)
2     ``jaxmodel.ops``, ``jaxmodel.comm`` (one device; the network)
2.5   ``hw_db`` — its *files* are data that any layer may read by path
      (``hw_db/tech/*.toml``); its *package* is the loader layer: it builds ``types``
      objects and validates devices against ``ops``, so it sits just above them
2.7   ``jaxmodel.parallel.plan``, ``jaxmodel.parallel.pipeline`` (the plan's rules, the
      placement of its groups and the schedules' counts: the workload checks its layer
      split with them, so they sit below it)
3     ``jaxmodel.workload`` (layer op lists, memory, MoE)
4     ``jaxmodel.parallel`` (pipeline, training step, inference, GEMM tables)
4.5   ``jaxmodel.energy`` (device power and energy per token of a step or a request batch)
5     ``jaxmodel.cost`` (area, chiplet, device, TCO, micro-architecture)
5.5   ``jaxmodel.serving`` (serving systems in steady state, on ``parallel.inference``)
6     ``jaxmodel.search`` (sweeps, parallelism search, co-design)
6.5   ``jaxmodel.explain`` (elasticities and bottleneck view over any of the above)
7     ``jaxmodel`` (the package façade re-exporting the public API)
8     ``jaxmodel.cli``, ``jaxmodel.demo``, ``jaxmodel.plots`` (applications and reports)
====  =================================================================================
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("jaxmodel", "hw_db")

RANKS = {
    "jaxmodel.types": 0, "jaxmodel.numerics": 0, "jaxmodel.runtime": 0,
    "jaxmodel.tech_tables": 0, "jaxmodel.anchors": 0, "jaxmodel.recipes": 0,
    "jaxmodel.precision": 0.5,
    "jaxmodel.runtime_profile": 0,
    "jaxmodel.batching": 1,
    "jaxmodel.ops": 2, "jaxmodel.comm": 2,
    "hw_db": 2.5,
    "jaxmodel.parallel.plan": 2.7, "jaxmodel.parallel.pipeline": 2.7,
    "jaxmodel.workload": 3,
    "jaxmodel.parallel": 4,
    "jaxmodel.energy": 4.5,
    "jaxmodel.cost": 5,
    "jaxmodel.serving": 5.5,
    "jaxmodel.search": 6,
    "jaxmodel.explain": 6.5,
    "jaxmodel": 7,
    "jaxmodel.cli": 8, "jaxmodel.demo": 8, "jaxmodel.plots": 8,
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


def _imports(mod: str, path: Path, mods: dict) -> set[str]:
    """Modules of ours imported anywhere in ``path`` (module level and inside functions)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(tree):
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
    assert "jaxmodel.ops" in g["hw_db"]                       # a late import inside a function
    assert "jaxmodel.search.grid" in g["jaxmodel.search.explore"]
    assert sum(len(v) for v in g.values()) > 100


def test_no_upward_import():
    g = _graph()
    bad = sorted(f"{m} (layer {_rank(m)}) imports {t} (layer {_rank(t)})"
                 for m, ts in g.items() for t in ts if _rank(t) > _rank(m))
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_no_import_cycle():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles: " + "; ".join(" ↔ ".join(c) for c in cycles)


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
