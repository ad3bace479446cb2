"""Fit the NVLS all-reduce constants of an NVSwitch tier (``nvls_bw``,
``nvls_chunk_latency``) on nccl-tests all-reduce bus bandwidth of one 8xH100 SXM node.

The model's NVLS all-reduce time (:mod:`jaxmodel.comm.collectives`, ``in_network`` on an
NVLink tier with ``nvls_bw > 0``) is ``lat + (√(S·c) + √(o·n / nvls_bw))²``
(:func:`jaxmodel.comm.collectives._pipelined`) with NCCL's NVLS latency ``lat``
(``hwLat[NVLINK][NVLS][SIMPLE]``, :func:`jaxmodel.comm.nccl.latency`), ``S = 2`` steps
(multimem reduce, multimem store), ``o`` the NVLink packet overhead of the level, ``c`` the
per-chunk overhead. Both constants are fitted by a grid on the mean absolute relative error
over every row (1 MiB - 8 GiB); the leave-one-size-out error refits without each row. Every
row ran NVLS: the run used NCCL 2.18.5 (Azure AI-benchmarking-guide, ND H100 v5 results,
"NVLS algorithm"), whose tuner gives NVLS no latency
(:data:`jaxmodel.comm.anchors.NCCL_8XH100_LEVEL`). The closed form is checked against
``jaxmodel.collective_latency(..., algorithm="in_network")``.

Run: ``PYTHONPATH=. .venv/bin/python experiments/calibrate_nvls.py`` (about a minute).
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

import jaxmodel as jm
import hw_db
from jaxmodel.comm import anchors, nccl

from common import ANCHORS  # noqa: E402
STEPS = 2.0


def closed_form(n, m, lvl, bw, c):
    lat = float(np.asarray(nccl.latency("in_network", "all_reduce", m, 0.0))[2])
    hdr, pay = float(lvl.header_bytes), float(lvl.max_payload_bytes)
    o = 1.0 + hdr / pay
    return lat + (np.sqrt(STEPS * c) + np.sqrt(o * n / bw)) ** 2


def main():
    ds = anchors.nccl_8xh100(ANCHORS)
    n, t, m = ds["nbytes"].astype(float), ds["seconds"], float(ds["group"][0])
    system = hw_db.system("dgx_h100")
    lvl = system.levels[0]
    bws = np.linspace(250e9, 350e9, 201)
    cs = np.concatenate([[0.0], np.geomspace(1e-8, 1e-5, 121)])

    def fit(mask):
        best = (np.inf, 0.0, 0.0)
        for b in bws:
            e = np.mean(np.abs(closed_form(n[mask], m, lvl, b, cs[:, None]) / t[mask] - 1.0),
                        axis=1)
            k = int(np.argmin(e))
            if e[k] < best[0]:
                best = (float(e[k]), float(b), float(cs[k]))
        return best

    err, bw, c = fit(np.ones(n.shape, bool))
    loso = []
    for i in range(len(n)):
        mask = np.ones(n.shape, bool)
        mask[i] = False
        _, bi, ci = fit(mask)
        loso.append(abs(closed_form(n[i:i + 1], m, lvl, bi, ci)[0] / t[i] - 1.0))
    print(f"nvls_bw = {bw:.4g} B/s, nvls_chunk_latency = {c:.3g} s: in-sample MAPE "
          f"{err * 100:.2f} %, leave-one-size-out {np.mean(loso) * 100:.2f} % "
          f"({len(n)} sizes, {n.min() / 2**20:g} MiB - {n.max() / 2**30:g} GiB)")
    fitted = dataclasses.replace(lvl, nvls_bw=bw, nvls_chunk_latency=c)
    sysf = dataclasses.replace(system, levels=(fitted,) + tuple(system.levels[1:]))
    model = np.asarray(jm.collective_latency(sysf, "all_reduce", n, ds["group"],
                                             algorithm="in_network"))
    cf = closed_form(n, m, lvl, bw, c)
    print("per size (model, %):", np.round((model / t - 1) * 100, 1))
    print(f"closed form vs model: max {np.max(np.abs(cf / model - 1)) * 100:.3f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
