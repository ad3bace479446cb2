"""Benchmark: the browser explorer (``jaxmodel ui``) — first page load and What-if slider moves.

Measures, in one process with the server on a free port (the persistent caches off,
``JAXMODEL_NO_CACHE=1``, so every compilation below starts from an empty cache):

- first page load: from a fresh server (``jaxmodel.ui`` imported, nothing compiled) to the
  page ready in headless Chromium (``body[data-ready]``: page, script, Plotly's bundle from
  the ``plotly`` wheel and the option lists), where ``/usr/bin/chromium`` and ``playwright``
  are installed; else the same requests over HTTP (page, script, bundle, options);
- What-if: one slider move = ``GET /api/whatif?sync=1`` = one batched ``jm.train_step`` over
  256 values of the HBM bandwidth (the slider's value among them) plus ``jm.tco`` on the
  answers; the first move compiles, then ``MOVES`` moves to other values, wall time and the
  process's CPU time (all threads) per move. The question: GPT-2 small training on the
  4×A100 node, tp = 4, 16 × 1024 tokens.

Targets (2 cores): a warm move ≤ 0.5 s, first page load ≤ 10 s. The load average is printed:
the machine may be shared, and CPU seconds per move are what a quiet machine's wall time
approaches (the batched call runs on both cores).

Run: ``.venv/bin/python experiments/bench_ui.py`` → prints the figures and writes
``experiments/out/bench_ui.csv``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
import urllib.parse
import urllib.request

os.environ.setdefault("JAXMODEL_NO_CACHE", "1")

from common import OUT  # noqa: E402

MOVES = 8
FORM = {"system": "hgx_a100_4gpu", "model": "gpt2-small", "phase": "train", "tp": "4",
        "global_batch": "16", "seq_len": "1024", "sweep": "mem_bw"}


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=3600) as r:
        return r.read()


def page_load(base: str) -> tuple[float, str]:
    """Seconds from the request to the page ready, and how it was measured."""
    from pathlib import Path
    chromium = Path("/usr/bin/chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if chromium.exists() and sync_playwright is not None:
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"]
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(chromium), args=args)
            page = browser.new_page()
            t0 = time.perf_counter()
            page.goto(base)
            page.wait_for_selector("body[data-ready='1']", timeout=120_000)
            dt = time.perf_counter() - t0
            browser.close()
        return dt, "chromium"
    t0 = time.perf_counter()
    for path in ("", "static/app.js", "static/plotly.min.js", "api/options"):
        _get(base + path)
    return time.perf_counter() - t0, "http"


def main() -> None:
    t0 = time.perf_counter()
    from jaxmodel.ui import compute, make_server
    t_import = time.perf_counter() - t0
    srv = make_server("127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_port}/"
    load, how = page_load(base)
    print(f"import jaxmodel.ui {t_import:.2f} s; first page load {load:.2f} s ({how}); "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)

    system = compute._system(FORM)
    bw = compute.knob_values(system)["mem_bw"]
    lo, hi = bw / 2, bw * 2

    def move(value: float) -> tuple[float, float, dict]:
        q = urllib.parse.urlencode({**FORM, "k_mem_bw": value, "lo": lo, "hi": hi,
                                    "sync": 1})
        w0, c0 = time.perf_counter(), time.process_time()
        out = json.loads(_get(f"{base}api/whatif?{q}"))
        return time.perf_counter() - w0, time.process_time() - c0, out

    cold_wall, cold_cpu, first = move(bw)
    assert len(first["x"]) == 256, len(first["x"])
    print(f"first move (compiles): {cold_wall:.1f} s wall, {cold_cpu:.1f} s CPU", flush=True)
    walls, cpus = [], []
    for i in range(MOVES):
        w, c, out = move(lo + (hi - lo) * (i + 0.5) / MOVES)
        walls.append(w)
        cpus.append(c)
    la = os.getloadavg()[0]
    med_w, med_c = statistics.median(walls), statistics.median(cpus)
    print(f"warm slider move, 256-point sweep: median {med_w:.3f} s wall "
          f"(min {min(walls):.3f}, max {max(walls):.3f}), {med_c:.3f} s CPU; "
          f"load average {la:.1f} on {os.cpu_count()} cores; target 0.5 s", flush=True)
    srv.shutdown()
    OUT.mkdir(parents=True, exist_ok=True)
    rows = [("import_s", t_import), ("first_page_load_s", load),
            ("first_move_wall_s", cold_wall), ("first_move_cpu_s", cold_cpu),
            ("warm_move_wall_median_s", med_w), ("warm_move_wall_min_s", min(walls)),
            ("warm_move_cpu_median_s", med_c), ("load_average", la)]
    with open(OUT / "bench_ui.csv", "w") as f:
        f.write("metric,value\n" + "".join(f"{k},{v:.4g}\n" for k, v in rows))
        f.write(f"page_load_measured_with,{how}\n")
    print(f"wrote {OUT / 'bench_ui.csv'}")


if __name__ == "__main__":
    sys.exit(main())
