"""The explorer's local web server: a page, its script, Plotly's bundle and a JSON API.

Why this stack: Python's own :mod:`http.server` (``ThreadingHTTPServer``) serves the page and
a small JSON API, and the charts are Plotly's, whose JavaScript bundle ships inside the
``plotly`` wheel (``plotly.offline.get_plotlyjs()``). That is one well-kept, widely used
dependency (the optional ``ui`` extra), no web framework, no build step, and nothing fetched
from the network at run time (no CDN): the whole app works on a machine without internet. A
full framework (Panel/Bokeh, Streamlit, Gradio) would bring tens of packages and its own
server process model for four pages whose state already lives in the URL.

Routes (``GET`` with the form in the query, or ``POST`` with a JSON body ``{"form": {...},
"model_config": {...}}`` for an uploaded ``config.json``)::

    /                         the page (index.html); ?page=predict|whatif|search|compare&...
    /static/app.js            the page's script; /static/plotly.min.js Plotly's bundle
    /api/options              names of systems, models, precisions, runtimes, knobs
    /api/knobs                the what-if knobs of a system and their current values
    /api/predict|whatif|search|compare|explain
                              start the work as a job: {"job": id}; ``sync=1`` answers at
                              once; ``format=csv`` answers with a CSV file (a download)
    /api/job/<id>             {"state": "running", "elapsed_s": ...} | {"state": "done",
                              "result": ...} | {"state": "error", "field": ..., "message": ...}

Bad input answers HTTP 400 with ``{"error": message, "field": name}``; the page shows it next
to the named input. JAX work runs on worker threads one at a time (a lock), so a slider move
waits for the search before it, never competes with it for the cores.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import threading
import time
import traceback
import urllib.parse
import webbrowser
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Mapping

from jaxmodel.ui import compute

STATIC = Path(__file__).with_name("static")
DEFAULT_PORT = 8765

_PLOTLY_JS: bytes | None = None


def plotly_js() -> bytes:
    """Plotly's JavaScript bundle from the installed ``plotly`` package (no network)."""
    global _PLOTLY_JS
    if _PLOTLY_JS is None:
        try:
            from plotly.offline import get_plotlyjs
        except ImportError:                     # page still works; charts say what is missing
            return (b"window.Plotly=null;console.error('the plotly package is not installed:"
                    b" pip install jaxmodel[ui]');")
        _PLOTLY_JS = get_plotlyjs().encode()
    return _PLOTLY_JS


# --------------------------------------------------------------------------------------------
# jobs: long work on a worker thread, polled by the page for progress
# --------------------------------------------------------------------------------------------
class Jobs:
    """Background work with its state; one computation at a time (``lock``)."""

    def __init__(self, keep: int = 64):
        self.lock = threading.Lock()
        self._jobs: dict[str, dict] = {}
        self._ids = itertools.count(1)
        self._keep = keep
        self._mu = threading.Lock()

    def start(self, name: str, fn: Callable[[], Any]) -> str:
        jid = f"{name}-{next(self._ids)}"
        job = {"state": "queued", "name": name, "t0": time.perf_counter()}
        with self._mu:
            self._jobs[jid] = job
            for old in list(self._jobs)[:-self._keep]:
                self._jobs.pop(old, None)

        def work():
            with self.lock:
                job["state"] = "running"
                job["t_run"] = time.perf_counter()
                job.update(run(fn))
        threading.Thread(target=work, name=jid, daemon=True).start()
        return jid

    def status(self, jid: str) -> dict | None:
        job = self._jobs.get(jid)
        if job is None:
            return None
        out = {k: v for k, v in job.items() if k not in ("t0", "t_run")}
        out["elapsed_s"] = round(time.perf_counter() - job["t0"], 2)
        return out


def run(fn: Callable[[], Any]) -> dict:
    """``fn()`` as a job outcome: done with its result, or an error naming the field."""
    t0 = time.perf_counter()
    try:
        result = fn()
    except compute.FormError as e:
        return {"state": "error", "field": e.field, "message": str(e)}
    except (ValueError, KeyError, TypeError) as e:
        return {"state": "error", "field": None, "message": f"{type(e).__name__}: {e}"}
    except Exception as e:  # pragma: no cover - shown in the page rather than lost
        traceback.print_exc()
        return {"state": "error", "field": None, "message": f"{type(e).__name__}: {e}"}
    return {"state": "done", "result": result, "wall_s": round(time.perf_counter() - t0, 3)}


# --------------------------------------------------------------------------------------------
# API
# --------------------------------------------------------------------------------------------
def _compare(form: Mapping, body: Mapping | None) -> dict:
    """``plans`` in the body (a list of forms), or ``p<i>.<field>`` keys in the query."""
    plans = (body or {}).get("plans")
    if plans is None:
        by: dict[int, dict] = {}
        for k, v in form.items():
            head, dot, field = k.partition(".")
            if dot and head.startswith("p") and head[1:].isdigit():
                by.setdefault(int(head[1:]), {})[field] = v
        plans = [by[i] for i in sorted(by)]
    if not isinstance(plans, list) or not all(isinstance(p, Mapping) for p in plans):
        raise compute.FormError("plans", "expected a list of plan forms")
    return compute.compare(plans, body)


def _knobs(form: Mapping, body: Mapping | None) -> dict:
    system = compute._system(form)
    names = compute.knob_names(system)
    return {"knobs": {k: {"label": v[0], "unit": v[1]} for k, v in names.items()},
            "values": compute.knob_values(system), "n_devices": float(system.n_devices)}


API: dict[str, tuple[Callable, Callable | None]] = {
    "predict": (compute.predict, compute.predict_rows),
    "whatif": (compute.whatif, compute.whatif_rows),
    "search": (compute.search, lambda r: r["rows"]),
    "compare": (_compare, compute.compare_rows),
    "knobs": (_knobs, None),
    "explain": (compute.sensitivities, compute.sensitivity_rows),
}


def to_csv(rows: list[Mapping]) -> str:
    """Rows (dicts) as CSV text, the columns in first-seen order."""
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    return buf.getvalue()


def _json_default(o):
    import numpy as np
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def _dumps(obj) -> bytes:
    return json.dumps(obj, default=_json_default, allow_nan=False).encode()


class Handler(BaseHTTPRequestHandler):
    server_version = "jaxmodel-ui"
    jobs: Jobs          # set by make_server
    quiet = True

    def log_message(self, fmt, *args):  # noqa: D102
        if not self.quiet:
            super().log_message(fmt, *args)

    # -- responses
    def _send(self, status: int, body: bytes, ctype: str, extra: Mapping | None = None):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, obj, status: int = 200):
        self._send(status, _dumps(obj), "application/json")

    def _error(self, message: str, field: str | None = None, status: int = 400):
        self._json({"error": message, "field": field}, status)

    # -- routing
    def do_GET(self):  # noqa: N802
        url = urllib.parse.urlsplit(self.path)
        form = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        self._route(url.path, form, None)

    def do_POST(self):  # noqa: N802
        url = urllib.parse.urlsplit(self.path)
        n = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(n) or b"{}") if n else {}
        except json.JSONDecodeError as e:
            return self._error(f"request body is not JSON ({e})", "body")
        if not isinstance(body, dict):
            return self._error("request body must be a JSON object", "body")
        form = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        form.update({k: v for k, v in (body.get("form") or {}).items()})
        self._route(url.path, form, body)

    def _route(self, path: str, form: dict, body: Mapping | None):
        if path in ("/", "/index.html"):
            return self._send(200, (STATIC / "index.html").read_bytes(),
                              "text/html; charset=utf-8")
        if path == "/static/plotly.min.js":
            return self._send(200, plotly_js(), "application/javascript",
                              {"Cache-Control": "max-age=86400"})
        if path.startswith("/static/"):
            name = path.removeprefix("/static/")
            f = STATIC / name
            if "/" in name or ".." in name or not f.is_file():
                return self._error(f"no such file {name!r}", None, 404)
            ctype = {"js": "application/javascript", "css": "text/css",
                     "png": "image/png"}.get(f.suffix[1:], "application/octet-stream")
            return self._send(200, f.read_bytes(), ctype)
        if path == "/api/options":
            return self._json(compute.options())
        if path.startswith("/api/job/"):
            st = self.jobs.status(path.removeprefix("/api/job/"))
            return self._json(st) if st is not None else self._error("no such job", "job",
                                                                          404)
        name = path.removeprefix("/api/")
        if path.startswith("/api/") and name in API:
            return self._api(name, form, body)
        return self._error(f"no such page {path!r}", None, 404)

    def _api(self, name: str, form: dict, body: Mapping | None):
        fn, rows = API[name]
        fmt = form.pop("format", "json")
        sync = form.pop("sync", "0") in ("1", "true") or fmt == "csv" or name == "knobs"
        form.pop("page", None)
        if fmt not in ("json", "csv"):
            return self._error(f"expected json or csv, got {fmt!r}", "format")
        if not sync:
            return self._json({"job": self.jobs.start(name, lambda: fn(form, body))})
        with self.jobs.lock:
            out = run(lambda: fn(form, body))
        if out["state"] == "error":
            return self._error(out["message"], out["field"])
        if fmt == "csv":
            if rows is None:
                return self._error(f"{name} has no CSV form", "format")
            return self._send(200, to_csv(rows(out["result"])).encode(), "text/csv",
                              {"Content-Disposition":
                               f'attachment; filename="jaxmodel_{name}.csv"'})
        return self._json(out["result"])


def make_server(host: str = "127.0.0.1", port: int = DEFAULT_PORT, *,
                quiet: bool = True) -> ThreadingHTTPServer:
    """A server bound to ``host:port`` (port 0: any free port; ``server.server_port``)."""
    handler = type("BoundHandler", (Handler,), {"jobs": Jobs(), "quiet": quiet})
    srv = ThreadingHTTPServer((host, port), handler)
    srv.daemon_threads = True
    return srv


def serve(host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, open_browser: bool = False,
          quiet: bool = True) -> None:
    """Serve the explorer until interrupted (Ctrl-C)."""
    srv = make_server(host, port, quiet=quiet)
    url = f"http://{host}:{srv.server_port}/"
    print(f"jaxmodel ui: serving on {url} (Ctrl-C stops)", flush=True)
    if open_browser:
        webbrowser.open(url)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
