"""How far can the GEMM mapping grid of ``jaxmodel.ops.gemm`` be pruned? (greedy set cover)

The GEMM mapper evaluates a fixed list of mappings for every design point: each of the 160
tilings ``GRID_CANDIDATES`` (L2 tile m × n × k, L1 tile m = n in systolic-array sizes; chosen
by greedy forward selection from a 7 L2-m × 5 n/m × 8 L2-k × 5 L1 product grid) crossed with
the L1 k-tiles ``L1_TK``, k-tiles at or above a tiling's L2 k-tile merged (exact):
``jaxmodel.ops.gemm.GRID``. Sweep speed is proportional to the number of mappings.

This script evaluates every mapping on random problems — devices (the hw_db devices with
perturbed buffers, bandwidths, clock, cores, systolic arrays and lanes) × GEMM shapes of LLM
layers (several models, TP degrees, token counts, attention heads) and random shapes, in 1-,
2- and 4-byte words — and greedily picks the mappings that attain the full grid's minimum (to
a relative ``--tol``) on every training problem (set cover). On a held-out set of problems
(other device perturbations and shapes) it reports, for growing prefixes of that cover, the
share of problems whose minimum rises, the mean / p99 / max relative excess, and problems the
subset cannot map at all. A subset is exact only where those are zero.

Writes ``experiments/out/select_gemm_grid.csv`` (subset size vs held-out excess) and prints
the cover as ``GRID_CANDIDATES``-style rows (L2 m, n, k, L1 arrays, L1 k).

Run: ``.venv/bin/python experiments/select_gemm_grid.py [--problems 40000] [--tol 1e-6]``
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # this checkout's jaxmodel
import jaxmodel  # noqa: E402,F401  (before hw_db)
import hw_db  # noqa: E402
from jaxmodel.ops import gemm as G  # noqa: E402

from common import OUT  # noqa: E402


def mapping_universe() -> np.ndarray:
    """Reference grid (5, P): the tilings of ``jaxmodel.ops.gemm`` × its L1 k-tiles."""
    return G._mappings(G.GRID_CANDIDATES, G.L1_TK)


def random_devices(rng, n_per_base: int):
    devs = []
    for name in hw_db.names("device"):
        base = hw_db.device(name)
        devs.append(base)
        for _ in range(n_per_base):
            sa = float(rng.choice([8.0, 16.0, 32.0, 64.0, 128.0])) if rng.random() < 0.4 \
                else float(base.sa_rows)
            devs.append(dataclasses.replace(
                base,
                global_buffer_bytes=float(base.global_buffer_bytes) * 2 ** rng.uniform(-3, 2),
                local_buffer_bytes=float(base.local_buffer_bytes) * 2 ** rng.uniform(-2, 2),
                mem_bw=float(base.mem_bw) * 2 ** rng.uniform(-1.5, 1.5),
                core_count=float(max(1, round(float(base.core_count) * 2 ** rng.uniform(-1, 1)))),
                physical_core_count=0.0,        # a die of exactly the enabled cores
                global_buffer_bytes_per_cycle=float(base.global_buffer_bytes_per_cycle)
                * 2 ** rng.uniform(-2, 1),
                freq_hz=float(base.freq_hz) * 2 ** rng.uniform(-0.5, 0.5),
                sa_rows=sa, sa_cols=sa,
                lanes_per_core=float(rng.choice([1.0, 2.0, 4.0, 8.0])) if rng.random() < 0.3
                else float(base.lanes_per_core)))
    return devs


def llm_shapes():
    shapes = set()
    for d, hd in ((768, 64), (2048, 128), (4096, 128), (5120, 128), (8192, 128),
                  (12288, 128)):
        for tp in (1, 2, 4, 8):
            for t in (1, 8, 32, 128, 512, 2048, 8192, 16384, 65536):
                shapes |= {(t, 3 * d // tp, d), (t, d, d // tp), (t, 4 * d // tp, d),
                           (t, d, 4 * d // tp)}
            for s in (128, 512, 2048, 8192):
                shapes |= {(s, s, hd), (s, hd, s), (1, s, hd), (1, hd, s), (8, s, hd)}
    return sorted(shapes)


def random_shapes(rng, n):
    return [tuple(int(x) for x in np.round(2 ** rng.uniform(0, 16, 3))) for _ in range(n)]


def cost_matrix(grid, devs, shapes, rng, n_problems):
    """(P, C) cycles of every candidate of ``grid`` on P random (device, shape, word)
    problems; ``+inf`` where a candidate does not fit."""
    saved = G.GRID
    G.GRID = grid
    try:
        idx_d = rng.integers(0, len(devs), n_problems)
        idx_s = rng.integers(0, len(shapes), n_problems)
        words = jnp.asarray(rng.choice([1.0, 2.0, 2.0, 4.0], n_problems),
                            dtype=jnp.result_type(float))
        leaves = [jax.tree_util.tree_leaves(devs[i]) for i in idx_d]
        treedef = jax.tree_util.tree_structure(devs[0])
        batch = jax.tree_util.tree_unflatten(
            treedef, [jnp.asarray([lv[j] for lv in leaves]) for j in range(len(leaves[0]))])
        mnk = jnp.asarray([shapes[i] for i in idx_s], dtype=jnp.result_type(float))
        f = jax.jit(jax.vmap(lambda d, s, w: G._candidate_cycles(d, s[0], s[1], s[2], w)[0]))
        out = []
        for lo in range(0, n_problems, 256):
            sl = slice(lo, lo + 256)
            out.append(np.asarray(f(jax.tree_util.tree_map(lambda x: x[sl], batch), mnk[sl],
                                    words[sl])))
        return np.concatenate(out)
    finally:
        G.GRID = saved


def set_cover(cost, tol):
    """Indices of candidates, chosen greedily, that attain every problem's minimum (to ``tol``
    relative); in the order chosen (most problems covered first)."""
    ref = cost.min(axis=1, keepdims=True)
    ok = np.isfinite(ref[:, 0])
    covers = cost[ok] <= ref[ok] * (1.0 + tol)
    left = np.ones(covers.shape[0], dtype=bool)
    chosen = []
    while left.any():
        j = int(np.argmax(covers[left].sum(axis=0)))
        chosen.append(j)
        left &= ~covers[:, j]
    return chosen


def excess(cost, chosen):
    """Held-out excess of the subset's minimum over the full grid's: (share of problems
    above ``1e-6``, mean, p99, max relative excess, problems the subset cannot map)."""
    ref = cost.min(axis=1)
    ok = np.isfinite(ref)
    sub = cost[ok][:, chosen].min(axis=1)
    lost = int(np.sum(~np.isfinite(sub)))
    r = sub / ref[ok] - 1.0
    r = r[np.isfinite(r)]
    return (float(np.mean(r > 1e-6)), float(np.mean(r)), float(np.percentile(r, 99)),
            float(np.max(r)), lost)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", type=int, default=40000)
    ap.add_argument("--tol", type=float, default=1e-6)
    args = ap.parse_args(argv)
    U = mapping_universe()
    rng = np.random.default_rng(0)
    devs = random_devices(rng, 12)
    shapes = llm_shapes() + random_shapes(rng, 400)
    train = cost_matrix(U, devs, shapes, rng, args.problems)
    test = cost_matrix(U, random_devices(np.random.default_rng(1), 6),
                       llm_shapes() + random_shapes(np.random.default_rng(2), 300),
                       np.random.default_rng(3), args.problems)
    chosen = set_cover(train, args.tol)
    print(f"reference grid: {U.shape[1]} mappings; set cover of {len(train)} training "
          f"problems: {len(chosen)} mappings; {len(test)} held-out problems")
    rows = []
    for s in sorted({*range(100, len(chosen), 100), len(chosen)}):
        share, mean, p99, mx, lost = excess(test, chosen[:s])
        rows.append((s, share, mean, p99, mx, lost))
        print(f"{s:4d} mappings: held-out {share * 100:5.2f} % of problems above the "
              f"reference minimum; excess mean {mean * 100:.4f} %, p99 {p99 * 100:.3f} %, "
              f"max {mx * 100:.2f} %; unmappable {lost}")
    OUT.mkdir(parents=True, exist_ok=True)
    np.savetxt(OUT / "select_gemm_grid.csv", np.asarray(rows), delimiter=",",
               header="size,share_above,mean_excess,p99_excess,max_excess,unmappable",
               comments="")
    sel = sorted(chosen, key=lambda j: tuple(U[[2, 0, 1, 3, 4], j]))
    print("GRID_CANDIDATES = (")
    for j in sel:
        print(f"    ({U[0, j]:.0f}, {U[1, j]:.0f}, {U[2, j]:.0f}, {U[3, j]:.0f}, {U[4, j]:.0f}),")
    print(")")


if __name__ == "__main__":
    main(sys.argv[1:])
