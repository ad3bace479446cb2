"""The browser explorer's HTTP endpoints (jaxmodel.ui), without a browser and without JAX
work: the page, its script, Plotly's bundle (shipped by the package, no CDN), the option
lists, CSV, and bad input answered with HTTP 400 naming the field."""

from __future__ import annotations

import json
import threading
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
