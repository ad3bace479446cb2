"""Wafer-level primitives: dies per wafer, reticle utilisation, defect yield, die cost.

Single-configuration JAX functions (scalar inputs), shared by the chiplet cost model
(:mod:`jaxmodel.cost.chiplet`) and the per-device cost (:mod:`jaxmodel.cost.device`).
Units: mm, mm², defects/mm², USD.

Sources:
    * Graening et al. / CATCH (``nanocad-lab/CATCH`` @ d60dafb), re-stated in
      aligned-grid dies per wafer, reticle
      (litho) penalty, negative-binomial yield on the critical area.
    * ttm-cas ``supply_chain_model.py`` (LLMCompass cost submodule), notes §6.2: the closed-form
      dies per wafer ``π(D/2)²/A − πD/√(2A)`` and ``(1 + A·D/α)^−α``.

Example:
    >>> n = dies_per_wafer_grid(jnp.sqrt(100.), jnp.sqrt(100.), 300., 0.1, 0.13)   # 637
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxmodel.numerics import max_of, safe_div

DEFAULT_K = 16   # central-block row counts tried by the grid search (best k <= 14 for >= 1 mm²)
DEFAULT_ROWS = 64  # rows stepped outward from the central block (enough for dies >= ~5 mm²)


def _safe_sqrt(v):
    """sqrt(max(v, 0)) with a finite gradient at and below zero (double-where)."""
    ok = v > 0
    return jnp.where(ok, jnp.sqrt(jnp.where(ok, v, 1.0)), 0.0)


def _chord(h, radius):
    """Length of the wafer chord at distance ``h`` from the centre, mm (0 outside)."""
    return 2.0 * _safe_sqrt(radius * radius - h * h)


def dies_per_wafer_grid(x, y, diameter, edge_exclusion, scribe, k_max: int = DEFAULT_K,
                        rows: int = DEFAULT_ROWS):
    """Exact dies per wafer for an aligned-grid placement (CATCH ``wafer_fill_grid=True``).

    A central block of ``k`` die rows straddles the wafer centre line; every row of it holds
    ``⌊(chord(h₀)+s)/x_e⌋`` dies (``h₀ = k·y_e/2 − s/2`` is the block's outer die edge,
    ``x_e = x + s``). The column grid starts at the left end of that chord; rows outside the block
    step outwards by ``y_e`` and keep the dies of that grid that fit inside their chord (counted
    top and bottom). The best ``k`` wins. Source: CATCH ``design.py`` (notes §2.1). The usable
    radius is ``D/2 − edge_exclusion``.

    Measured against CATCH (``catch_dies_per_wafer_reference.csv``) with ``k_max = 16``:
    identical for 15 of 21 square sizes 1–858 mm²; small dies are high by ≤ 0.07 % (1, 2, 10,
    15, 32 mm²) and the 858 mm² full-reticle die gives 63 instead of 64 (the exact column
    alignment rule of CATCH is not documented). ``k_max = 8`` halves the work but misses the
    best block for some 50 mm² dies (enough to flip the 10 nm optimum of the 800 mm² sweep).

    Args:
        x, y: die width and height, mm.
        diameter: wafer diameter, mm.
        edge_exclusion: unusable rim, mm.
        scribe: dicing width added to each die in x and y, mm.
        k_max: largest central-block row count tried (static).
        rows: outer rows evaluated on each side (static); dies smaller than about
            ``(D/2/rows)²`` are undercounted.

    Returns:
        Dies per wafer (float, integral value). Zero gradient almost everywhere; see
        :func:`dies_per_wafer` for a straight-through variant.
    """
    radius = diameter / 2.0 - edge_exclusion
    xe, ye = x + scribe, y + scribe
    k = jnp.arange(1, k_max + 1, dtype=jnp.result_type(float))
    h0 = k * ye / 2.0 - scribe / 2.0
    c0 = _chord(h0, radius)
    n = jnp.floor(safe_div(c0 + scribe, xe) + 1e-9)
    valid_k = (h0 < radius) & (n > 0)
    left = -c0 / 2.0
    j = jnp.arange(1, rows + 1, dtype=jnp.result_type(float))
    h_out = h0[:, None] + j[None, :] * ye
    c2 = _chord(h_out, radius)
    lo = jnp.ceil(safe_div(-c2 / 2.0 - left[:, None], xe) - 1e-9)
    hi = jnp.floor(safe_div(c2 / 2.0 - x - left[:, None], xe) + 1e-9)
    # Chords of outer rows are nested intervals, so counts only shrink outwards: summing the
    # positive counts equals CATCH's "step outwards until a row is empty".
    cnt = jnp.maximum(hi - lo + 1.0, 0.0)
    total = n * k + 2.0 * jnp.sum(cnt, axis=1)
    return max_of(jnp.where(valid_k, total, 0.0))


def dies_per_wafer_smooth(x, y, diameter, edge_exclusion, scribe):
    """Closed-form dies per wafer ``π·D_u²/(4·x_e·y_e) − π·D_u/√(2·x_e·y_e)`` (smooth).

    Source: the (disabled) closed form in CATCH ``design.py`` (notes §2.1); with
    ``edge_exclusion = scribe = 0`` it is ttm-cas ``dies_per_wafer_area``. It is 0.5–8 % below
    the exact grid count for large dies. Units: mm in, dies out.
    """
    du = diameter - 2.0 * edge_exclusion
    pitch_area = (x + scribe) * (y + scribe)
    return jnp.pi * du * du / (4.0 * pitch_area) - jnp.pi * du / jnp.sqrt(2.0 * pitch_area)


def dies_per_wafer(x, y, diameter, edge_exclusion, scribe, mode: str = "exact",
                   k_max: int = DEFAULT_K, rows: int = DEFAULT_ROWS):
    """Dies per wafer: ``"exact"`` grid count, ``"smooth"`` closed form.

    In ``"exact"`` mode the value is the grid count and the gradient is that of the closed form
    (straight-through), so d cost / d area stays informative.

    Example:
        >>> float(dies_per_wafer(26.0, 33.0, 300.0, 3.0, 0.1))   # mm: a reticle-sized die
        64.0
    """
    smooth = dies_per_wafer_smooth(x, y, diameter, edge_exclusion, scribe)
    if mode == "smooth":
        return smooth
    if mode != "exact":
        raise ValueError(f"dpw mode={mode!r} is not one of ['exact', 'smooth']")
    exact = dies_per_wafer_grid(jax.lax.stop_gradient(x), jax.lax.stop_gradient(y), diameter,
                                edge_exclusion, scribe, k_max, rows)
    return smooth + jax.lax.stop_gradient(exact - smooth)


def reticle_utilization(area, reticle_x, reticle_y):
    """Fraction of the (multi-)reticle field used by whole dies, CATCH §2.2.

    ``n = ⌈A/A_r⌉`` reticles, ``u = ⌊n·A_r/A⌋·A/(n·A_r)`` (area only, shape ignored).
    """
    ar = reticle_x * reticle_y
    n = jnp.maximum(jnp.ceil(safe_div(area, ar, 1.0) - 1e-9), 1.0)
    fit = jnp.floor(safe_div(n * ar, area, 1.0) + 1e-9)
    return safe_div(fit * area, n * ar, 1.0)


def litho_factor(area, reticle_x, reticle_y, litho_percent):
    """Layer-cost multiplier ``(1 − p) + p/u`` for reticle utilisation ``u`` (CATCH §2.2)."""
    u = reticle_utilization(area, reticle_x, reticle_y)
    return (1.0 - litho_percent) + safe_div(litho_percent, u, 1.0)


def negative_binomial_yield(area, defect_density, alpha):
    """Defect yield ``(1 + A·D/α)^−α`` (Stapper; CATCH §2.3, ttm-cas ``yield_rate``).

    Args:
        area: defect-sensitive (critical) area, mm².
        defect_density: defects per mm².
        alpha: clustering factor.

    Example:
        >>> float(negative_binomial_yield(100.0, 0.001, 3.0))   # 1 cm², 0.1 defects/cm²
        0.906
    """
    a = jnp.maximum(alpha, 1e-6)
    return jnp.power(1.0 + jnp.maximum(area, 0.0) * defect_density / a, -a)


def wafer_cost_from_per_mm2(cost_per_mm2, diameter):
    """CATCH wafer price: ``cost_per_mm2 · π(D/2)²`` over the FULL wafer (quirk 1, notes §4.5)."""
    return cost_per_mm2 * jnp.pi * (diameter / 2.0) ** 2
