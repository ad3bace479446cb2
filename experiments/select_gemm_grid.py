"""Choose the static GEMM candidate grid of ``jaxmodel.ops.gemm`` (greedy forward selection).

The GEMM mapper evaluates a fixed list of tilings (L2 tile m × n × k, L1 tile m = n in
systolic-array sizes) for every design point, so the list must be short for sweep speed
(the performance target is ≥ 5,000 GPT-3 layers/s on 2 cores, ~16 GEMM searches each) and
still find near-optimal mappings. This script

1. builds a dense product "universe" grid (7 L2-m × 5 n/m ratios × 8 L2-k × 5 L1 sizes);
2. evaluates every candidate on a training set of problems: random devices (the hw_db devices
   with perturbed buffers, bandwidths, cores, systolic arrays and lanes) × GEMM shapes of LLM
   layers (several models, TP degrees and token counts, attention heads) and random shapes;
3. greedily adds, one at a time, the candidate that most reduces the mean log-excess
   ``log(best of subset / best of universe)`` until ``--size`` candidates are chosen;
4. reports the excess on a held-out set of problems and prints the list to paste into
   ``jaxmodel/ops/gemm.py`` (``GRID_CANDIDATES``).

Writes ``experiments/out/select_gemm_grid.csv`` (subset size vs held-out mean/p95/max excess).

Run: ``.venv/bin/python experiments/select_gemm_grid.py [--size 160]``
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from pathlib import Path

import numpy as np

import jax
import jax.numpy as jnp

import jaxmodel  # noqa: F401  (before hw_db)
import hw_db
from jaxmodel.ops import gemm as G

OUT = Path(__file__).resolve().parent / "out"
UNIVERSE_L2_M = (64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0)
UNIVERSE_RATIO = (0.25, 0.5, 1.0, 2.0, 4.0)
UNIVERSE_L2_K = (128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0)
UNIVERSE_L1 = (1.0, 2.0, 4.0, 8.0, 16.0)


def universe() -> np.ndarray:
    rows = [(tm, tm * r, tk, t1) for tk, tm, r, t1 in
            itertools.product(UNIVERSE_L2_K, UNIVERSE_L2_M, UNIVERSE_RATIO, UNIVERSE_L1)]
    return np.asarray(rows, dtype=np.float64).T


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
                global_buffer_bytes_per_cycle=float(base.global_buffer_bytes_per_cycle)
                * 2 ** rng.uniform(-2, 1),
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


def cost_matrix(devs, shapes, rng, n_problems):
    """(P, C) cycles of every universe candidate on P random (device, shape) problems."""
    G.GRID = universe()
    idx_d = rng.integers(0, len(devs), n_problems)
    idx_s = rng.integers(0, len(shapes), n_problems)
    leaves = [jax.tree_util.tree_leaves(devs[i]) for i in idx_d]
    treedef = jax.tree_util.tree_structure(devs[0])
    batch = jax.tree_util.tree_unflatten(
        treedef, [jnp.asarray([lv[j] for lv in leaves]) for j in range(len(leaves[0]))])
    mnk = jnp.asarray([shapes[i] for i in idx_s], dtype=jnp.result_type(float))
    f = jax.jit(jax.vmap(lambda d, s: G._candidate_cycles(d, s[0], s[1], s[2], 2.0)[0]))
    out = []
    for lo in range(0, n_problems, 256):
        sl = slice(lo, lo + 256)
        out.append(np.asarray(f(jax.tree_util.tree_map(lambda x: x[sl], batch), mnk[sl])))
    return np.concatenate(out)


def greedy(cost, size, cap=3.0):
    """Indices of ``size`` candidates chosen greedily to minimise the mean log-excess."""
    ref = cost.min(axis=1, keepdims=True)
    ok = np.isfinite(ref[:, 0])
    cost, ref = cost[ok], ref[ok]
    logc = np.minimum(np.log(np.where(np.isfinite(cost), cost, np.inf) / ref), cap)
    chosen = []
    cur = np.full(len(cost), cap)
    for _ in range(size):
        score = np.minimum(cur[:, None], logc).mean(axis=0)
        score[chosen] = np.inf
        j = int(np.argmin(score))
        chosen.append(j)
        cur = np.minimum(cur, logc[:, j])
    return chosen


def excess(cost, chosen):
    ref = cost.min(axis=1)
    ok = np.isfinite(ref)
    sub = cost[ok][:, chosen].min(axis=1)
    r = sub / ref[ok] - 1.0
    r = np.where(np.isfinite(r), r, 10.0)
    return float(np.mean(r)), float(np.percentile(r, 95)), float(np.max(r))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=160)
    ap.add_argument("--problems", type=int, default=3000)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    devs = random_devices(rng, 12)
    shapes = llm_shapes() + random_shapes(rng, 400)
    train = cost_matrix(devs, shapes, rng, args.problems)
    test = cost_matrix(random_devices(np.random.default_rng(1), 6),
                       llm_shapes() + random_shapes(np.random.default_rng(2), 300),
                       np.random.default_rng(3), args.problems // 2)
    chosen = greedy(train, args.size)
    U = universe()
    rows = []
    for s in (40, 80, 120, 160, 200, 240):
        if s <= len(chosen):
            m, p95, mx = excess(test, chosen[:s])
            rows.append((s, m, p95, mx))
            print(f"{s:4d} candidates: held-out excess mean {m * 100:.2f} %, "
                  f"p95 {p95 * 100:.2f} %, max {mx * 100:.1f} %")
    OUT.mkdir(parents=True, exist_ok=True)
    np.savetxt(OUT / "select_gemm_grid.csv", np.asarray(rows), delimiter=",",
               header="size,mean_excess,p95_excess,max_excess", comments="")
    sel = sorted(chosen, key=lambda j: tuple(U[[2, 0, 1, 3], j]))
    print("GRID_CANDIDATES = (")
    for j in sel:
        print(f"    ({U[0, j]:.0f}, {U[1, j]:.0f}, {U[2, j]:.0f}, {U[3, j]:.0f}),")
    print(")")


if __name__ == "__main__":
    main(sys.argv[1:])
