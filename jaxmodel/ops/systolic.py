"""Cycle count of one systolic array computing an output-stationary ``[M×K]·[K×N]`` tile.

Sources:

- LLMCompass (Zhang et al., ISCA'24), §III-B1 "From local buffer to lanes" and its
  ``simulate_systolic_array_cycle_count``: one output-stationary fold of an ``H×W`` array
  takes ``K + H + W − 2`` cycles (``K`` MACs per PE plus the skewed fill and drain of the
  operand wavefronts, as SCALE-Sim v2 of Samajdar et al., ISPASS'20, simulates it for
  LLMCompass), and a tile has ``ceil(M/H)·ceil(N/W)`` folds. SCALE-Sim runs the folds back
  to back, each one paying its own fill and drain (``folds·(K + H + W − 2) − 1``, which every one of
  LLMCompass's 58,000 cached rows matches); for large tiles
  (``M·N·K / (H·W·max(H, W)) ≥ 64``) LLMCompass instead takes ``folds·K / u`` with a
  utilisation ``u = 0.98`` (ratio ≥ 64) or ``0.99`` (ratio ≥ 128), i.e. the folds pipelined.
- The folds of a tile are independent (different output blocks), so a pipelined array
  issues the next fold's operands while the previous fold drains (Kung, "Why systolic
  architectures?", IEEE Computer 1982, §"pipelining"; on GPUs the tensor-core ``mma``
  instructions of independent accumulators, from one warp and across the resident warps,
  issue back to back and hide each other's latency: NVIDIA, CUDA C++ Programming Guide,
  §"Warp Matrix Functions" / §5.2.3 "Multiprocessor level"). The pipeline then pays the fill
  and drain once per tile pass: ``folds·K + (H + W − 2) − 1`` cycles (one fold issued every
  ``K`` cycles, plus the fill and drain latency of the last one).

This one form is used for every tile. It is continuous and non-decreasing in ``M, N, K``, and
its utilisation ``folds·K / (folds·K + H + W − 3)`` reproduces LLMCompass's large-tile
constants (16×16 array: 0.972 at ratio 64, 0.986 at 128, 0.993 at 256, against 0.98 / 0.99),
without LLMCompass's step between the SCALE-Sim rows and the utilisation formula (up to
``(K + H + W − 2)/K`` ≈ 1.5× at the switch for ``K = 64``).

The count is floored at ``M·N·K / (H·W)`` (an array does at most ``H·W`` MACs per cycle;
binding only for a 1×1 array) and divided by ``mac_per_cycle`` (MACs per PE per cycle).
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxmodel import numerics as nx


def pipelined_fold_cycles(folds, k, rows, cols):
    """Cycles of ``folds`` output-stationary folds of depth ``k`` pipelined through one
    ``rows × cols`` array: ``folds·k + rows + cols − 3`` (module docstring). Shape only."""
    return folds * k + (rows + cols - 3.0)


def systolic_cycles(m, n, k, rows, cols, mac_per_cycle=1.0):
    """Cycles for one ``rows × cols`` systolic array to compute an ``m×k @ k×n`` tile.

    Args:
        m, n, k: tile dimensions (elements); broadcastable arrays.
        rows, cols: array height ``H`` and width ``W`` (PEs).
        mac_per_cycle: MACs per PE per cycle.

    Returns:
        Cycles (float array): ``max(ceil(m/H)·ceil(n/W)·k + H + W − 3, m·n·k/(H·W)) /
        mac_per_cycle``. Shape-only quantity: its gradient w.r.t. hardware rates is zero.

    Example:
        >>> float(systolic_cycles(16, 16, 16, 16, 16))      # one fold: 16 + 30 − 1
        45.0
        >>> float(systolic_cycles(64, 64, 16, 16, 16))      # 16 folds pipelined: 256 + 29
        285.0
    """
    folds = nx.ceil_div(m, rows) * nx.ceil_div(n, cols)
    cycles = pipelined_fold_cycles(folds, k, rows, cols)
    # an array does at most rows·cols MACs per cycle (binds only for a 1×1 array, where
    # the "− 3" would give k − 1 cycles for k MACs)
    cycles = jnp.maximum(cycles, nx.safe_div(m * n * k, rows * cols, fill=jnp.inf))
    return nx.safe_div(cycles, mac_per_cycle, fill=jnp.inf)
