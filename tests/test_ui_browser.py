"""The explorer in a real browser: headless Chromium (Debian's ``chromium`` package) driven by
Playwright fills the Predict form, gets a field's error shown, moves a What-if slider, clicks
a point of the search's Pareto front and compares two plans; the numbers shown must equal
``jm.train_step`` for the same inputs. Screenshots go to ``experiments/out/ui_*.png``.

Skipped (with the reason) where ``/usr/bin/chromium`` or the ``playwright`` package is
missing. Slow: the first question of each shape compiles (minutes on 2 loaded cores).
"""

from __future__ import annotations

import dataclasses
import re
import threading
import urllib.parse
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
OUT = Path(__file__).resolve().parents[1] / "experiments" / "out"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WAIT_MS = 900_000          # a cold compile on a loaded 2-core machine takes minutes

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser_page():
    if not CHROMIUM.exists():
        pytest.skip("no browser: /usr/bin/chromium is not installed (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="the playwright package is not installed "
                                          "(pip install jaxmodel[browser])")
    from jaxmodel.ui import make_server
    srv = make_server("127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.base = f"http://127.0.0.1:{srv.server_port}/"
        yield page
        browser.close()
    srv.shutdown()
    srv.server_close()


def _number(text: str) -> float:
    return float(re.match(r"\s*([-+0-9.eE]+)", text).group(1))


def _query(page) -> dict:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(page.url).query))


def test_explorer_in_chromium(browser_page):
    import hw_db
    import jaxmodel as jm
    page = browser_page
    OUT.mkdir(parents=True, exist_ok=True)
    page.goto(page.base)
    page.wait_for_selector("body[data-ready='1']", timeout=60_000)

    # Predict: fill the form; a bad field is shown by name first
    page.select_option("#f-system", "hgx_a100_4gpu")
    page.select_option("#f-model", "gpt2-small")
    page.fill("#f-tp", "abc")
    page.click("#run-predict")
    page.wait_for_function("document.querySelector('#e-tp').textContent.length > 0")
    assert page.text_content("#e-tp").startswith("tp:")
    page.fill("#f-tp", "4")
    page.fill("#f-global_batch", "16")
    page.fill("#f-seq_len", "1024")
    page.click("#run-predict")
    page.wait_for_selector("#v-step_time_s", timeout=WAIT_MS)
    shown = _number(page.text_content("#v-step_time_s"))
    q = _query(page)
    assert q["model"] == "gpt2-small" and q["tp"] == "4" and q["page"] == "predict"
    system = hw_db.system("hgx_a100_4gpu")
    model = hw_db.model("gpt2-small")
    par = jm.Parallelism(dp=1, tp=4)
    want = float(jm.train_step(system, model, par, 16, 1024).step_time_s)
    assert shown == pytest.approx(want, rel=1e-4)
    page.wait_for_selector("#chart-breakdown .main-svg")
    page.screenshot(path=str(OUT / "ui_predict.png"), full_page=True)

    # What-if: the answer at the slider, then a slider move changes it
    page.click("nav a[data-page='whatif']")
    page.wait_for_function("document.querySelector('#w-value').textContent !== '–'",
                           timeout=WAIT_MS)
    before = float(page.get_attribute("#w-value", "data-raw"))
    assert before == pytest.approx(want, rel=1e-5)
    page.eval_on_selector("#k-mem_bw", "el => { el.value = el.min * 1.2; "
                          "el.dispatchEvent(new Event('input', {bubbles: true})); }")
    page.wait_for_function(f"parseFloat(document.querySelector('#w-value').dataset.raw) "
                           f"!== {before!r}", timeout=WAIT_MS)
    after = float(page.get_attribute("#w-value", "data-raw"))
    bw = float(_query(page)["k_mem_bw"]) * 1e9
    slow = dataclasses.replace(system, device=dataclasses.replace(system.device, mem_bw=bw))
    assert after == pytest.approx(float(jm.train_step(slow, model, par, 16, 1024).step_time_s),
                                  rel=1e-5)
    assert after > before                    # less bandwidth, a longer step
    page.screenshot(path=str(OUT / "ui_whatif.png"), full_page=True)

    # Search: the front as a scatter; clicking a point shows its plan and breakdown
    page.click("nav a[data-page='search']")
    page.click("#run-search")
    page.wait_for_selector("#chart-front .scatterlayer .trace:nth-of-type(2) .point",
                           timeout=WAIT_MS)
    page.locator("#chart-front .scatterlayer .trace:nth-of-type(2) .point").first.click(
        force=True)
    page.wait_for_function("document.querySelector('#search-pick').textContent"
                           ".includes('chosen point')", timeout=60_000)
    page.wait_for_selector("#pick-breakdown .main-svg", timeout=WAIT_MS)
    page.screenshot(path=str(OUT / "ui_search.png"), full_page=True)

    # Compare: two plans side by side
    page.click("nav a[data-page='compare']")
    page.click("#add-plan")
    page.fill("#f-tp", "2")
    page.dispatch_event("#f-tp", "change")
    page.click("#add-plan")
    page.click("#run-compare")
    page.wait_for_selector("#compare-table th:nth-of-type(3)", timeout=WAIT_MS)
    assert "p2.tp" in _query(page)
    page.screenshot(path=str(OUT / "ui_compare.png"), full_page=True)
