"""Benchmark: one question from the shell — ``jaxmodel predict`` as a fresh process each time.

Measures, each in its own fresh Python process: ``import jaxmodel``; ``jaxmodel predict train``
and ``jaxmodel predict inference`` on an empty cache (first answer: trace, lower, compile) and
then twice on the warm cache (second answer: the command line's export cache of compiled
executables, ``jaxmodel.batching``, loaded in background threads from the start of a
repeated command line), plus the same question with other numbers (same shapes: the stored
executables are reused) and, for reference, with the caches off (``JAXMODEL_NO_CACHE=1``) and
with the caches off and XLA's default CPU emitters (the library's compiler settings, instead
of the command line's ``batching.CPU_COMPILE_OPTIONS`` in ``XLA_FLAGS``). Whole-process wall
time and CPU time (user + system of the child), and the load average, since the machine may be shared. Checks that
every answer is identical to the library-settings one and that warm runs write nothing to
stderr. Targets (2 quiet cores): warm ≤ 1.5 s, empty cache ≤ 6 s, import ≤ 1 s.

The caches go to a temporary ``XDG_CACHE_HOME`` so nothing of the user's is read or written.
Python may write bytecode (``PYTHONDONTWRITEBYTECODE`` is dropped for the children), as in
an installed package, so the import rows measure a second import, not source compilation.

Run: ``.venv/bin/python experiments/bench_predict.py`` → prints a table and writes
``experiments/out/bench_predict.csv``.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time

import pandas as pd

from common import OUT, ROOT  # noqa: E402
# the console script's entry point, run on this checkout (argv[0] is what the script sets)
CLI = ("import sys; sys.argv[0] = 'jaxmodel'; from jaxmodel.cli import main; "
       "sys.exit(main())")
QUESTIONS = {
    "train": ["predict", "train", "--system", "dgx_a100", "--nodes", "2", "--model",
              "llama2-13b", "--tp", "8", "--pp", "2", "--seq-len", "2048"],
    "inference": ["predict", "inference", "--system", "hgx_a100_4gpu", "--model",
                  "llama2-13b", "--tp", "4", "--batch", "8", "--prompt-len", "512",
                  "--gen-len", "64"],
}
OTHER_NUMBERS = {"train": ["--global-batch", "64"], "inference": ["--batch", "16"]}


def _run(args: list[str], env: dict) -> tuple[float, float, str, str, int]:
    """Wall and CPU seconds of one fresh process, its stdout, stderr and exit status."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if r.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(args[3:])} failed:\n{r.stderr[-2000:]}")
    return wall, cpu, r.stdout, r.stderr, r.returncode


def main() -> pd.DataFrame:
    rows = []
    with tempfile.TemporaryDirectory(prefix="jaxmodel-bench-") as tmp:
        # TF_CPP_MIN_LOG_LEVEL: this process's own JAX import set it to 1, which a child
        # would inherit (a shell has none; the command line's default hides jaxlib's cache
        # loader lines, see jaxmodel.process.prepare_logging)
        base = {k: v for k, v in os.environ.items()
                if k not in ("JAXMODEL_CACHE_DIR", "JAXMODEL_NO_CACHE", "XLA_FLAGS",
                             "JAX_COMPILATION_CACHE_DIR", "PYTHONDONTWRITEBYTECODE",
                             "TF_CPP_MIN_LOG_LEVEL")}
        env = {**base, "XDG_CACHE_HOME": tmp, "PYTHONPATH": str(ROOT)}
        off = {**env, "JAXMODEL_NO_CACHE": "1"}
        library = {**off, "XLA_FLAGS": "--xla_cpu_use_fusion_emitters=true"}

        def rec(what, case, args, e):
            load = os.getloadavg()[0]
            wall, cpu, out, err, status = _run([sys.executable, "-c", CLI] + args, e)
            rows.append({"question": what, "case": case, "wall_s": round(wall, 2),
                         "cpu_s": round(cpu, 2), "load_average": round(load, 1),
                         "status": status, "stderr_bytes": len(err)})
            print(f"{what:10s} {case:30s} {wall:7.2f} s wall {cpu:7.2f} s CPU "
                  f"(load {load:.1f}){'  stderr: ' + err[:200] if err else ''}", flush=True)
            return out

        for i in (1, 2):
            load = os.getloadavg()[0]
            wall, cpu, _, _, _ = _run([sys.executable, "-c", "import jaxmodel"], off)
            rows.append({"question": "import jaxmodel", "case": f"fresh process #{i}",
                         "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                         "load_average": round(load, 1), "status": 0})
            print(f"import jaxmodel #{i} (whole process) {wall:.2f} s wall {cpu:.2f} s CPU "
                  f"(load {load:.1f})", flush=True)
        for what, args in QUESTIONS.items():
            first = rec(what, "empty cache", args, env)
            warm = [rec(what, f"warm cache #{i}", args, env) for i in (1, 2)]
            rec(what, "warm, other numbers", args + OTHER_NUMBERS[what], env)
            plain = rec(what, "caches off", args, off)
            ref = rec(what, "caches off, library XLA flags", args, library)
            same = all(x == ref for x in [first, plain] + warm)
            print(f"{what:10s} answers identical to the library-settings one: {same}")
            rows[-1]["identical"] = same
    df = pd.DataFrame(rows)
    OUT.mkdir(parents=True, exist_ok=True)
    df.to_csv(OUT / "bench_predict.csv", index=False)
    return df


if __name__ == "__main__":
    main()
