"""Cycle count of one systolic array computing an output-stationary ``[M×K]·[K×N]`` tile.

Source: LLMCompass §III-B1 "From local buffer to lanes" and its
``simulate_systolic_array_cycle_count`` ():

- small tiles: SCALE-Sim v2 output-stationary, which matches the closed form
  ``ceil(M/H)·ceil(N/W)·(K + H + W − 2) − 1`` on every one of the 58,000 cached rows;
- large tiles (``M·N·K / (H·W·max(H, W)) ≥ 64``): the folds are pipelined and LLMCompass uses a
  utilisation formula, ``ceil(M/H)·ceil(N/W)·K / u`` with ``u = 0.99`` (ratio ≥ 128) or
  ``u = 0.98`` (ratio ≥ 64); the ceilings pad thin tiles (``u = M/H`` for ``M < H``).

Both are floored at ``M·N·K / (H·W)`` (an array does at most ``H·W`` MACs per cycle) and
divided by ``mac_per_cycle`` (MACs per PE per cycle).
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxmodel import numerics as nx


def systolic_cycles(m, n, k, rows, cols, mac_per_cycle=1.0):
    """Cycles for one ``rows × cols`` systolic array to compute an ``m×k @ k×n`` tile.

    Args:
        m, n, k: tile dimensions (elements); broadcastable arrays.
        rows, cols: array height ``H`` and width ``W`` (PEs).
        mac_per_cycle: MACs per PE per cycle.

    Returns:
        Cycles (float array). Shape-only quantity: its gradient w.r.t. hardware rates is zero.

    Example:
        >>> float(systolic_cycles(16, 16, 16, 16, 16))      # one fold: 16 + 30 − 1
        45.0
    """
    folds = nx.ceil_div(m, rows) * nx.ceil_div(n, cols)
    closed = folds * (k + rows + cols - 2.0) - 1.0
    ratio = nx.safe_div(m * n * k, rows * cols * jnp.maximum(rows, cols))
    util = jnp.where(ratio >= 128.0, 0.99, 0.98)
    pipelined = folds * k / util
    cycles = jnp.where(ratio >= 64.0, pipelined, closed)
    # an array does at most rows·cols MACs per cycle: never below m·n·k / (rows·cols) (the
    # closed form's "− 1" would give k − 1 cycles for k MACs on a 1×1 array)
    cycles = jnp.maximum(cycles, nx.safe_div(m * n * k, rows * cols, fill=jnp.inf))
    return nx.safe_div(cycles, mac_per_cycle, fill=jnp.inf)
