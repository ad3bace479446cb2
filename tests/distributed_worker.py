"""One process of a local ``jax.distributed`` job for tests/test_distributed.py (and the
scenarios' single-process reference, imported from there).

Usage: ``python tests/distributed_worker.py OUT_DIR scenario[,scenario...]`` with the job's
coordinator, size and rank in ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` /
``JAX_PROCESS_ID`` (:func:`jaxmodel.distributed.launch_local` sets them). Each process
writes ``{scenario: result}`` to ``OUT_DIR/p<rank>.pkl``; a scenario that raises
``ValueError`` records the message instead.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hw_db  # noqa: E402
import jaxmodel as jm  # noqa: E402
from jaxmodel.batching import batched  # noqa: E402

SERVING_OPTS = dict(tp=(1, 2, 4), pp=(1, 2), max_batch=(8, 64), chunk=(0, 256),
                    precision=("bf16",), runtime=("trtllm",), loads=(0.3, 0.9),
                    progress=False)


@batched
def roofline(dev, m, n, k, par):
    """Toy single-config formula: GEMM roofline time per TP shard, s."""
    flops = 2.0 * m * n * k / par.tp
    nbytes = 2.0 * (m * k + k * n / par.tp + m * n / par.tp)
    t = jnp.maximum(flops / dev.peak_matrix_flops, nbytes / dev.mem_bw)
    return {"time_s": t, "bound": jnp.where(flops / dev.peak_matrix_flops > nbytes / dev.mem_bw,
                                            1, 0), "pair": (t * 2.0, jnp.stack([t, -t]))}


def _sweep(bws=(1e11, 3e12, 7), gather=True):
    # a batched leaf (two core counts) times a 7 x 5 x 3 grid: 210 points, uneven shares
    dev = dataclasses.replace(hw_db.device("a100_80gb"), core_count=jnp.asarray([64.0, 108.0]))
    return jm.sweep(roofline, dev, 1.0, 8192, 8192, jm.Parallelism(), chunk=4,
                    grid={"dev.mem_bw": np.linspace(*bws), "par.tp": [1, 2, 4, 8, 16],
                          "m": [1, 64, 4096]}, progress=False,
                    sweep_options=jm.SweepOptions(block=8, gather=gather))


def _sweep_parts():
    # each process keeps its own rows (one file per process in a large sweep)
    return _sweep(gather=False)


def _sweep_tiny(gather=True):
    # fewer points than processes: some processes have no share
    return jm.sweep(roofline, hw_db.device("a100_80gb"), 1.0, 64, 64, jm.Parallelism(),
                    grid={"m": [1, 2, 3]}, progress=False,
                    sweep_options=jm.SweepOptions(gather=gather))


def _sweep_tiny_parts():
    return _sweep_tiny(gather=False)


def _mismatch():
    # process 1 asks for another grid than process 0
    return _sweep((1e11, 3e12, 7 + jm.distributed.process_index()))


def _parallelism():
    return jm.search_parallelism(hw_db.system("hgx_a100_4gpu"), hw_db.model("gpt2-small"), 4,
                                 8, 256, progress=False,
                                 step_options={"dp_overlap": [0.0, 1.0]})


def _serving():
    return jm.search_serving(hw_db.system("hgx_a100_4gpu"), hw_db.model("llama3.2-1b"), 4,
                             512, 128, ttft_slo_s=0.5, tpot_slo_s=0.02, full=True,
                             **SERVING_OPTS)


def _codesign():
    def obj(p):
        return (jnp.log(p["bw"] / 2e12)) ** 2 + (jnp.log(p["cores"] / 100)) ** 2
    return jm.codesign(obj, {"bw": 1e12, "cores": 64}, {"bw": (1e11, 1e13), "cores": (8, 256)},
                       steps=30, integer=("cores",), options=jm.CodesignOptions(n_starts=5))


def _local():
    # each process sweeps whole inside local() (no split), then the job gathers by hand
    with jm.distributed.local():
        df = _sweep_tiny()
        assert jm.distributed.gather("x") == ["x"]
    df.attrs["gathered"] = jm.distributed.gather(jm.distributed.process_index())
    return df


SCENARIOS = {"local": _local, "sweep": _sweep, "sweep_tiny": _sweep_tiny, "mismatch": _mismatch,
             "sweep_parts": _sweep_parts, "sweep_tiny_parts": _sweep_tiny_parts,
             "parallelism": _parallelism, "serving": _serving, "codesign": _codesign}


def main(out_dir: str, names: str) -> None:
    jm.distributed.initialize()
    jax.config.update("jax_numpy_rank_promotion", "raise")
    jax.config.update("jax_enable_x64", False)      # as tests/conftest.py (float32)
    results = {}
    for name in names.split(","):
        try:
            results[name] = SCENARIOS[name]()
        except ValueError as e:
            results[name] = f"ValueError: {e}"
    rank = jm.distributed.process_index()
    with open(os.path.join(out_dir, f"p{rank}.pkl"), "wb") as f:
        pickle.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
