"""Total cost of ownership: capital amortised over a lifetime + energy.

``usd_per_hour = capex / (lifetime·8760 h) + P·PUE·price/1000``, with
``P = n_devices · (TDP·utilization + host share)`` W, or with the workload's modelled board
power (:mod:`jaxmodel.energy`) in place of ``TDP·utilization`` when ``power_w_per_device`` is
given. Derived: USD per million generated tokens
(``usd_per_hour / (3600·tokens_per_s) · 1e6``) and USD per training run
(``usd_per_hour · run_time_s / 3600``). Defaults and their sources: ``hw_db/tech/datacenter.toml``
(lifetime, PUE, electricity price, host power). Guo et al. §VI names TCO as the extension of its
chiplet cost model; the formula is the standard capex + opex amortisation (e.g. Barroso et al.,
"The Datacenter as a Computer", ch. 6).

Example:
    >>> t = jm.tco(hw_db.system("dgx_a100", nodes=128), tokens_per_s=2.0e5)
    >>> float(t.usd_per_hour), float(t.usd_per_million_tokens)
    (3.92e+02, 0.545)
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax.numpy as jnp

from jaxmodel.batching import batched
from jaxmodel.cost import tech
from jaxmodel.cost.area import area_fields
from jaxmodel.cost.device import _system_cost_single
from jaxmodel.numerics import safe_div, sanitize, where_feasible
from jaxmodel.types import System, _register

HOURS_PER_YEAR = 365.0 * 24.0


@dataclasses.dataclass(frozen=True)
class TCO:
    """Cost of ownership (USD).

    Attributes:
        usd_per_hour: capital + energy per hour of operation.
        capex_usd: system capital cost.
        capex_per_hour: capital amortised per hour.
        energy_per_hour: electricity per hour (incl. PUE).
        power_w: IT power drawn, W.
        usd_per_million_tokens: per million generated tokens (``inf`` when no rate given).
        usd_per_run: per training run (``0`` when no run time given).
    """

    usd_per_hour: Any
    capex_usd: Any
    capex_per_hour: Any
    energy_per_hour: Any
    power_w: Any
    usd_per_million_tokens: Any
    usd_per_run: Any


_register(TCO)


def _default(key):
    return tech.table("datacenter")["operation"][key]


class DatacenterOperation(NamedTuple):
    """The data-centre operating assumptions of :func:`tco` (each ≤ 0: the value of
    ``hw_db/tech/datacenter.toml``; every field may be batched).

    Attributes:
        lifetime_years: service life over which the capital is amortised, years.
        pue: power usage effectiveness (facility power / IT power).
        usd_per_kwh: price of electricity, USD/kWh.
        utilization: average utilisation, the fraction of TDP drawn (when no
            ``power_w_per_device`` is given).

    Example:
        >>> base = jm.tco(hw_db.system("dgx_a100"))
        >>> hot = jm.tco(hw_db.system("dgx_a100"), operation=jm.DatacenterOperation(pue=2.0))
        >>> bool(hot.energy_per_hour > base.energy_per_hour)
        True
    """

    lifetime_years: Any = -1.0
    pue: Any = -1.0
    usd_per_kwh: Any = -1.0
    utilization: Any = -1.0


def _tco_single(system: System, tokens_per_s=0.0, run_time_s=0.0, capex_usd=-1.0,
                operation: DatacenterOperation = DatacenterOperation(),
                include_yield: bool = True,
                power_w_per_device=-1.0) -> TCO:
    """Single-configuration body of :func:`tco` (the operating assumptions as one
    :class:`DatacenterOperation`)."""
    pick = lambda v, k: jnp.where(v > 0, v, _default(k))  # noqa: E731
    life = pick(operation.lifetime_years, "lifetime_years")
    pue_ = pick(operation.pue, "pue")
    price = pick(operation.usd_per_kwh, "usd_per_kwh")
    util = pick(operation.utilization, "utilization")
    built = _system_cost_single(system, include_yield).total_usd
    capex = jnp.where(capex_usd > 0, capex_usd, built)
    n = system.n_devices
    # A negative or non-finite board power or device count is not a system: +inf cost
    # (double-where: the formulas see harmless values there, so gradients stay finite).
    ok = ((system.device.tdp_w >= 0) & jnp.isfinite(system.device.tdp_w) & (n >= 0)
          & jnp.isfinite(n))
    tdp = sanitize(system.device.tdp_w, ok, 0.0)
    n = sanitize(n, ok, 0.0)
    # the modelled board power of the workload (jaxmodel.energy) where given, else TDP·util
    board = jnp.where(power_w_per_device > 0, power_w_per_device, tdp * util)
    power = n * (board + _default("host_power_w_per_device"))
    capex_h = capex / (life * HOURS_PER_YEAR)
    energy_h = where_feasible(ok, power / 1000.0 * pue_ * price)
    per_hour = capex_h + energy_h
    # per million tokens / per run: +inf without a positive rate; 0 without a run time;
    # an infinite hourly cost never meets a zero factor (no inf·0)
    finite_h = jnp.isfinite(per_hour)
    safe_h = sanitize(per_hour, finite_h, 0.0)
    per_mtok = where_feasible(finite_h, safe_div(safe_h * 1e6, 3600.0 * tokens_per_s, jnp.inf))
    has_run = run_time_s > 0
    run_s = sanitize(run_time_s, has_run, 0.0)
    per_run = jnp.where(has_run, where_feasible(finite_h, safe_h * run_s / 3600.0), 0.0)
    return TCO(usd_per_hour=per_hour, capex_usd=capex, capex_per_hour=capex_h,
               energy_per_hour=energy_h, power_w=where_feasible(ok, power),
               usd_per_million_tokens=per_mtok, usd_per_run=per_run)


_tco_batched = batched(_tco_single)


def tco(system: System, tokens_per_s=0.0, run_time_s=0.0, *, capex_usd=-1.0,
        operation: DatacenterOperation = DatacenterOperation(), include_yield: bool = True,
        power_w_per_device=-1.0) -> TCO:
    """Total cost of ownership of a system (capital + energy), USD.

    Args:
        system: a :class:`jaxmodel.System` (leaves may be batched).
        tokens_per_s: generated tokens per second of the whole system (for
            ``usd_per_million_tokens``), e.g. ``jm.inference(...).tokens_per_s`` × replicas.
        run_time_s: duration of a training run, s (for ``usd_per_run``), e.g.
            ``jm.train_step(...).step_time_s × steps``.
        capex_usd: system price; ≤ 0 uses :func:`jaxmodel.system_cost` (manufacturing cost).
        operation: :class:`DatacenterOperation` — ``lifetime_years``, ``pue``,
            ``usd_per_kwh``, ``utilization``; each ≤ 0 (default) uses
            ``hw_db/tech/datacenter.toml``.
        include_yield: see :func:`jaxmodel.device_cost`.
        power_w_per_device: board power per device while running, W, e.g.
            ``jaxmodel.energy.train_energy(...).power_w`` (the activity-dependent power
            model); ≤ 0 (default) uses ``tdp_w × utilization``.

    Returns:
        :class:`TCO`. All inputs may be batched arrays; the result is differentiable.
        Costs are ``+inf`` (never NaN) for a system that cannot be priced (an invalid device,
        a negative board power); ``usd_per_million_tokens`` is ``+inf`` without a positive
        token rate and ``usd_per_run`` is 0 without a positive run time.
    """
    sys_ = dataclasses.replace(system, device=area_fields(system.device))
    return _tco_batched(sys_, tokens_per_s, run_time_s, capex_usd, operation,
                        include_yield=include_yield, power_w_per_device=power_w_per_device)


tco.single = _tco_single
