"""Loaders for the measured all-reduce anchors (``validation/anchors``), as tidy arrays.

Each loader returns a dict with ``name``, ``system`` (hw_db name), ``nodes``, ``group`` (group
size per row), ``nbytes`` and ``seconds`` (measured latency), all numpy arrays, filtered to
the rows the acceptance criteria use. Used by ``experiments/validate_collectives.py``,
``experiments/calibrate_collectives.py`` and ``tests/comm``.

Sources (see the READMEs in the anchor folders):

- ``llmcompass_measured/allreduce_A100x4_measured.csv``: nccl-tests on a 4xA100 NVLink3 node
  (LLMCompass Fig. 5h), sizes >= 4 KiB.
- ``llmcompass_measured/allreduce_TPUv3.csv``: JAX psum on a TPUv3-8, sizes >= 4 KiB.
- ``network/nccl_allreduce_busbw_8xA100.csv``: nccl-tests bus bandwidth on 8xA100 (Azure ND
  A100 v4), sizes >= 64 KiB; latency = size / algbw, algbw = busbw · n / (2(n − 1)).
- ``network/nccl_allreduce_busbw_8xH100.csv``: nccl-tests bus bandwidth on one 8xH100 SXM
  NVSwitch node (Azure ND H100 v5, NCCL 2.18.5), 1 MiB - 8 GiB, converted as above; its
  ``level`` entry sets the tuner's NVLS latency of that release.
- ``network/allreduce_kernel_times_A100.csv``: vidur kernel times (median) on A100 DGX nodes.
- ``network/allreduce_kernel_times_H100.csv``: vidur kernel times (median) on one H100 DGX
  node, 2/4/8 GPUs, 2 KiB - 64 MiB.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["load_all", "a100x4", "tpuv3", "nccl_8xa100", "nccl_8xh100", "vidur", "vidur_h100", "mixed_modes",
           "subset", "NCCL_8XH100_LEVEL", "system_of"]


def _pack(name, system, nodes, group, nbytes, seconds):
    nbytes = np.asarray(nbytes, dtype=float)
    return {"name": name, "system": system, "nodes": int(nodes),
            "group": np.broadcast_to(np.asarray(group, dtype=float), nbytes.shape).copy(),
            "nbytes": nbytes, "seconds": np.asarray(seconds, dtype=float)}


def a100x4(root: Path, min_bytes: float = 4096):
    """LLMCompass 4xA100 NVLink3 all-reduce (sizes >= ``min_bytes``)."""
    d = pd.read_csv(Path(root) / "llmcompass_measured" / "allreduce_A100x4_measured.csv")
    d = d[d.size_bytes >= min_bytes]
    return _pack("llmcompass_a100x4", "hgx_a100_4gpu", 1, 4, d.size_bytes, d.latency_us * 1e-6)


def tpuv3(root: Path, min_bytes: float = 4096):
    """LLMCompass TPUv3-8 all-reduce (sizes >= ``min_bytes``)."""
    d = pd.read_csv(Path(root) / "llmcompass_measured" / "allreduce_TPUv3.csv", header=None,
                    sep=r",\s*", engine="python", names=["size", "seconds", "gbps"])
    d = d[d["size"] >= min_bytes]
    return _pack("llmcompass_tpuv3_8", "tpuv3_8", 1, 8, d["size"], d["seconds"])


def nccl_8xa100(root: Path, min_bytes: float = 65536):
    """nccl-tests all-reduce on 8xA100 (Azure ND A100 v4), converted from bus bandwidth."""
    d = pd.read_csv(Path(root) / "network" / "nccl_allreduce_busbw_8xA100.csv")
    d = d[d.size_bytes >= min_bytes]
    n = d.num_gpus.to_numpy(dtype=float)
    algbw = d.busbw_GBps.to_numpy() * 1e9 * n / (2.0 * (n - 1.0))
    return _pack("nccl_8xa100", "dgx_a100", 1, n, d.size_bytes, d.size_bytes / algbw)


#: NCCL release of the Azure ND H100 v5 nccl-tests run (Azure AI-benchmarking-guide, "Azure
#: Results/ND_H100_v5_results.md": NCCL 2.18.5, "NCCL AllReduce (NVLS algorithm)"): its tuner
#: gives NVLS no latency on NVLink (NCCL 2.18 src/graph/tuning.cc hwLat NVLS = 0), so it runs
#: NVLS at 1 MiB too, where NCCL 2.30.7 (NVLS 25 us) runs ring LL.
NCCL_8XH100_LEVEL = {"nccl_nvls_latency": 0.0}


def nccl_8xh100(root: Path, min_bytes: float = 2**20):
    """nccl-tests all-reduce on one 8xH100 SXM node (Azure ND H100 v5), converted from bus
    bandwidth as :func:`nccl_8xa100`. ``level`` holds the NetLevel fields of the measured
    NCCL release (:data:`NCCL_8XH100_LEVEL`) for the innermost tier."""
    d = pd.read_csv(Path(root) / "network" / "nccl_allreduce_busbw_8xH100.csv")
    d = d[d.size_bytes >= min_bytes]
    n = d.gpus.to_numpy(dtype=float)
    algbw = d.busbw_GBps.to_numpy() * 1e9 * n / (2.0 * (n - 1.0))
    ds = _pack("nccl_8xh100", "dgx_h100", 1, n, d.size_bytes, d.size_bytes / algbw)
    ds["level"] = dict(NCCL_8XH100_LEVEL)
    return ds


def vidur(root: Path, which: str = "single_node"):
    """vidur A100 DGX all-reduce kernel times (median).

    Args:
        which: ``"single_node"`` (2/4/8 GPUs in one node), ``"two_node_16"`` (16 GPUs,
            8 per node) or ``"two_node_other"`` (2x1, 2x2, 2x4 GPUs across two nodes).
    """
    d = pd.read_csv(Path(root) / "network" / "allreduce_kernel_times_A100.csv")
    single = d.num_workers == d.devices_per_node
    if which == "single_node":
        d, nodes = d[single], 1
    elif which == "two_node_16":
        d, nodes = d[(d.num_workers == 16) & (d.devices_per_node == 8)], 2
    elif which == "two_node_other":
        d, nodes = d[~single & (d.num_workers < 16)], 2
    else:
        raise ValueError(f"which={which!r} is not one of single_node, two_node_16, "
                         f"two_node_other")
    out = _pack(f"vidur_{which}", "a100_dgx_vidur", nodes, d.num_workers, d.size_bytes,
                d.time_median_ms * 1e-3)
    out["per_node"] = d.devices_per_node.to_numpy(dtype=float)
    out["seconds_min"] = d.time_min_ms.to_numpy(dtype=float) * 1e-3
    out["seconds_max"] = d.time_max_ms.to_numpy(dtype=float) * 1e-3
    return out


def vidur_h100(root: Path, min_bytes: float = 0.0):
    """vidur H100 DGX all-reduce kernel times (median), one node, 2/4/8 GPUs."""
    d = pd.read_csv(Path(root) / "network" / "allreduce_kernel_times_H100.csv")
    d = d[(d.num_workers == d.devices_per_node) & (d.size_bytes >= min_bytes)]
    out = _pack("vidur_h100_single_node", "h100_dgx_vidur", 1, d.num_workers, d.size_bytes,
                d.time_median_ms * 1e-3)
    out["per_node"] = d.devices_per_node.to_numpy(dtype=float)
    out["seconds_min"] = d.time_min_ms.to_numpy(dtype=float) * 1e-3
    out["seconds_max"] = d.time_max_ms.to_numpy(dtype=float) * 1e-3
    return out


def system_of(ds, system):
    """``system`` with the data set's ``level`` fields (the measured NCCL release, e.g.
    :data:`NCCL_8XH100_LEVEL`) on its innermost tier; ``system`` itself where it has none."""
    fields = ds.get("level")
    if not fields:
        return system
    levels = (dataclasses.replace(system.levels[0], **fields),) + tuple(system.levels[1:])
    return dataclasses.replace(system, levels=levels)


def subset(ds, keep):
    """The rows of a data set where the bool array ``keep`` is true (per-row arrays only)."""
    return {k: (v[keep] if isinstance(v, np.ndarray) and v.shape == keep.shape else v)
            for k, v in ds.items()}


def mixed_modes(ds, ratio: float = 2.0, window: float = 1.25):
    """Rows of a kernel-time set whose median mixes the two launch modes of the profiling
    loop (bool array; model-free).

    vidur times rank 0's NCCL kernels in an eager loop of 11 all-reduce launches per
    repetition (3 repetitions, each after a barrier; median over the 11 kernels, then
    min/median/max over the repetitions). When rank 0's host runs ahead, its queued kernels
    wait for the slowest peer's launch and last one host launch period; when rank 0 is the
    slowest launcher, they last the collective itself. A row is flagged when its repetitions
    disagree by more than ``ratio`` (both modes seen in one configuration) or its median is
    more than ``ratio`` away from the median of the same group's rows within a factor
    ``window`` in size (at least 3 of them; no device time jumps by 2x over 25 % more bytes).
    """
    t = ds["seconds"]
    flag = ds["seconds_max"] > ratio * ds["seconds_min"]
    s, g = ds["nbytes"], ds["group"]
    for i in range(len(t)):
        near = (g == g[i]) & (np.abs(np.log(s / s[i])) < np.log(window))
        near[i] = False
        if near.sum() >= 3:
            med = np.median(t[near])
            flag[i] |= (t[i] > ratio * med) | (t[i] < med / ratio)
    return flag


def load_all(root: Path):
    """Every acceptance dataset, in the order of the acceptance list, then the two-node A100
    rows (a documented comparison only: undocumented fabric)."""
    return [a100x4(root), tpuv3(root), nccl_8xa100(root), nccl_8xh100(root),
            vidur(root, "single_node"),
            vidur_h100(root), vidur(root, "two_node_16"), vidur(root, "two_node_other")]
