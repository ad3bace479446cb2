"""The browser explorer's HTTP endpoints (jaxmodel.ui), without a browser and without JAX
work: the page, its script, Plotly's bundle (shipped by the package, no CDN), the option
lists, CSV, and bad input answered with HTTP 400 naming the field."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from jaxmodel.ui import compute, server


@pytest.fixture(scope="module")
def url():
    srv = server.make_server("127.0.0.1", 0)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()
    srv.server_close()


def _get(url: str):
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.headers.get("Content-Type"), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read()


def test_page_script_and_plotly_bundle_are_served(url):
    status, ctype, body = _get(url + "/")
    assert status == 200 and ctype.startswith("text/html")
    for page in (b"page-predict", b"page-whatif", b"page-search", b"page-compare"):
        assert page in body
    assert b"http" not in body.replace(b"http-equiv", b"")   # no CDN, no remote asset
    status, ctype, body = _get(url + "/static/app.js")
    assert status == 200 and b"requestWhatif" in body
    pytest.importorskip("plotly")
    status, _, body = _get(url + "/static/plotly.min.js")
    assert status == 200 and len(body) > 1_000_000 and b"plotly" in body[:2000].lower()


def test_options_list_the_database(url):
    import hw_db
    status, _, body = _get(url + "/api/options")
    opts = json.loads(body)
    assert status == 200
    assert opts["models"] == hw_db.names("model")
    assert "dgx_a100" in opts["systems"] and "bf16" in opts["precisions"]
    assert opts["sweep_points"] == 256


@pytest.mark.parametrize("query, field", [
    ("tp=abc", "tp"), ("model=gpt-9", "model"), ("system=nowhere", "system"),
    ("nodes=0", "nodes"), ("phase=fly", "phase"), ("precision=fp3", "precision"),
    ("global_batch=1.5", "global_batch"), ("recompute=some", "recompute"),
    ("tp=3", "tp"),
])
def test_bad_input_is_answered_naming_the_field(url, query, field):
    status, _, body = _get(f"{url}/api/predict?sync=1&{query}")
    err = json.loads(body)
    assert status == 400, body
    assert err["field"] == field and err["error"].startswith(field), err


def test_bad_input_in_a_job_and_unknown_routes(url):
    status, _, body = _get(f"{url}/api/predict?seq_len=-5")
    job = json.loads(body)["job"]
    import time
    for _ in range(100):
        st = json.loads(_get(f"{url}/api/job/{job}")[2])
        if st["state"] in ("done", "error"):
            break
        time.sleep(0.05)
    assert st["state"] == "error" and st["field"] == "seq_len"
    assert _get(url + "/api/nothing")[0] == 404
    assert _get(url + "/static/../server.py")[0] == 404
    assert _get(url + "/api/job/none-1")[0] == 404
    status, _, body = _get(f"{url}/api/predict?sync=1&format=xml")
    assert status == 400 and json.loads(body)["field"] == "format"


def test_compare_needs_two_to_four_plans(url):
    status, _, body = _get(f"{url}/api/compare?sync=1&p1.model=gpt2-small")
    assert status == 400 and json.loads(body)["field"] == "plans"
    status, _, body = _get(f"{url}/api/compare?sync=1&p1.tp=x&p2.tp=1")
    assert status == 400 and json.loads(body)["field"] == "plan1.tp"


def test_sweep_points_hold_the_slider_value():
    xs = compute.sweep_points(3.3, 1.0, 4.0)
    assert xs.shape == (256,) and (xs[1:] >= xs[:-1]).all()
    assert 3.3 in xs and xs[0] == 1.0 and xs[-1] == 4.0


def test_csv_of_rows():
    text = server.to_csv([{"a": 1, "b": None}, {"a": 2, "c": "x"}])
    assert text == "a,b,c\n1,,\n2,,x\n"


@pytest.mark.slow
def test_whatif_and_predict_equal_the_library():
    """The What-if answer at the slider and the Predict headline are jm.inference's numbers
    for the same inputs (the network knob moved), one batched call of 256 points."""
    import dataclasses

    import hw_db
    import jaxmodel as jm
    form = {"system": "hgx_a100_4gpu", "model": "gpt2-small", "phase": "inference",
            "tp": "4", "batch": "4", "prompt_len": "256", "gen_len": "16",
            "sweep": "level0_bw", "k_level0_bw": "120"}
    out = compute.whatif(form)
    assert len(out["x"]) == compute.SWEEP_POINTS and 120.0 in out["x"]
    system = hw_db.system("hgx_a100_4gpu")
    lvl = dataclasses.replace(system.levels[0], bw_per_device=120e9)
    slow = dataclasses.replace(system, levels=(lvl,) + tuple(system.levels[1:]))
    want = jm.inference(slow, hw_db.model("gpt2-small"), jm.Parallelism(tp=4), 4, 256, 16)
    assert out["at"]["ttft_s"] == pytest.approx(float(want.ttft_s), rel=1e-6)
    assert out["at"]["tpot_s"] == pytest.approx(float(want.tpot_s), rel=1e-6)
    # more link bandwidth never slows the step (the curve is monotone)
    tpot = np.asarray(out["curves"]["tpot_s"], dtype=float)
    assert (np.diff(tpot) <= 1e-12 * tpot[:-1]).all()
    base = compute.predict({k: v for k, v in form.items() if not k.startswith(("sweep", "k_"))})
    plain = jm.inference(system, hw_db.model("gpt2-small"), jm.Parallelism(tp=4), 4, 256, 16)
    assert base["headline"]["ttft_s"] == pytest.approx(float(plain.ttft_s), rel=1e-6)


def test_search_form_errors_name_the_field():
    """Serving-search limits must be positive numbers; names are checked before any work."""
    for form, field in [({"kind": "serve", "ttft_slo": "-1"}, "ttft_slo"),
                        ({"kind": "serve", "precisions": "bf16,fp3"}, "precisions"),
                        ({"kind": "dance"}, "kind")]:
        with pytest.raises(compute.FormError) as e:
            compute.search({"model": "gpt2-small", "system": "dgx_h100", **form})
        assert e.value.field == field


def _fake_explanation(calls):
    """A stand-in for jm.explain_serve (no JAX work): records its arguments and answers a
    small table in the library's format."""
    import pandas as pd
    from jaxmodel.explain import Explanation

    def fake(*args, **kwargs):
        calls.append((args, kwargs))
        rows = [dict(metric=m, knob=k, value=v, elasticity=e, fd_forward=e, fd_backward=e,
                     fd_central=e, kink=k == "device.freq_hz", metric_value=mv, feasible=True)
                for m, mv, knobs in (
                    ("ttft_s", 0.5, [("device.freq_hz", 1.4e9, -0.61),
                                     ("device.mem_bw", 2e12, -0.12)]),
                    ("tpot_s", 0.01, [("device.mem_bw", 2e12, -0.51),
                                      ("levels[0].bw_per_device", 3e11, -0.1),
                                      ("device.freq_hz", 1.4e9, -0.03)]))
                for k, v, e in knobs]
        bn = {ph: {"compute": 0.3, "memory": 0.1, "communication": 0.05, "bubble": 0.0,
                   "overhead": 0.01} for ph in ("prefill", "decode")}
        return Explanation(table=pd.DataFrame(rows), metrics={"ttft_s": 0.5, "tpot_s": 0.01},
                           bottleneck=bn, power_w=321.0, power_limited=False, feasible=True,
                           reason=0)
    return fake


def test_sensitivities_card_endpoint(url, monkeypatch):
    """/api/explain answers the Predict form's sensitivities with jm.explain_serve's table:
    the top knobs per metric, the bottleneck view and the power; the library is called with
    the form's system, model, plan and workload; the CSV has one row per shown knob."""
    import jaxmodel as jm
    calls: list = []
    monkeypatch.setattr(jm, "explain_serve", _fake_explanation(calls))
    q = ("phase=inference&system=dgx_h100&model=llama3-8b&tp=8&batch=4&prompt_len=256"
         "&gen_len=16&runtime=trtllm&top=2")
    status, _, body = _get(url + "/api/explain?sync=1&" + q)
    assert status == 200, body
    r = json.loads(body)
    (args, kwargs), = calls
    assert args[0].name == "dgx_h100" and args[1].name == "llama3-8b"
    assert float(args[2].tp) == 8 and args[3:] == (jm.InferenceOptions(4.0, 256.0, 16.0),)
    assert kwargs == {"runtime": "trtllm"}
    assert [k["knob"] for k in r["metrics"]["tpot_s"]["knobs"]] == [
        "device.mem_bw", "levels[0].bw_per_device"]                     # top=2
    assert r["metrics"]["ttft_s"]["knobs"][0] == {
        "knob": "device.freq_hz", "elasticity": -0.61, "kink": True, "fd_forward": -0.61,
        "fd_backward": -0.61, "value": 1.4e9}
    assert r["metrics"]["ttft_s"]["value"] == 0.5 and r["power_w"] == 321.0
    assert set(r["bottleneck"]) == {"prefill", "decode"} and r["reason"] == "ok"
    assert r["knobs_total"] == 3
    # a background job by default (the page polls it), the CSV synchronously
    status, _, body = _get(url + "/api/explain?" + q)
    assert status == 200
    job = json.loads(body)["job"]
    for _ in range(200):            # the job ends while the stand-in is still in place
        st = json.loads(_get(f"{url}/api/job/{job}")[2])
        if st["state"] in ("done", "error"):
            break
        time.sleep(0.01)
    assert st["state"] == "done" and st["result"]["metrics"] == r["metrics"]
    status, ctype, body = _get(url + "/api/explain?format=csv&" + q)
    assert status == 200 and ctype == "text/csv"
    lines = body.decode().splitlines()
    assert lines[0].startswith("section,metric,knob,elasticity") and len(lines) == 1 + 4 + 10
    # bad input names the field before any work
    status, _, body = _get(url + "/api/explain?sync=1&phase=inference&tp=x")
    assert status == 400 and json.loads(body)["field"] == "tp"
