"""The report in a real browser: headless Chromium (Debian's package, installed by
scripts/test-deps.sh) opens the HTML file, driven over the DevTools protocol.

It checks what a person would see: every plot renders with a size, the page logs
no error, nothing is fetched but the file itself, the key numbers are on the
page. A screenshot is kept under $GPUVET_ARTIFACTS (or the test's tmp folder).
Without Chromium the test skips, and fails with GPUVET_REQUIRE_CLUSTER=1.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.clirun import gpuvet
from tests.unit.comparestore import build_store
from tests.unit.twoorders import two_orders_store

pytestmark = pytest.mark.integration
DEADLINE_S = 60


def _missing(what: str) -> None:
    if os.environ.get("GPUVET_REQUIRE_CLUSTER") == "1":
        pytest.fail(f"{what} (GPUVET_REQUIRE_CLUSTER=1); run scripts/test-deps.sh")
    pytest.skip(what)


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    _missing("headless Chromium is not installed")
    raise AssertionError  # not reached


@contextlib.contextmanager
def browser(profile: Path) -> Iterator[str]:
    """Chromium with a fresh profile and no background traffic; yields the page's
    DevTools websocket URL."""
    argv = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--disable-default-apps", "--disable-extensions",
            f"--user-data-dir={profile}", "--remote-debugging-port=0",
            "--window-size=1300,1000", "about:blank"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        port_file = profile / "DevToolsActivePort"
        end = time.monotonic() + DEADLINE_S
        while not (port_file.is_file() and port_file.read_text().strip()):
            if proc.poll() is not None:
                pytest.fail(f"chromium exited with {proc.returncode} before it listened")
            if time.monotonic() > end:
                pytest.fail("chromium did not write DevToolsActivePort in time")
            time.sleep(0.05)  # polling for the file chromium writes once it listens
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            pages = [t for t in json.load(r) if t.get("type") == "page"]
        yield pages[0]["webSocketDebuggerUrl"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


class Cdp:
    """A minimal DevTools protocol client: commands by id, events kept in order."""

    def __init__(self, url: str) -> None:
        try:
            import websocket
        except ImportError:
            _missing("the websocket-client package is not installed (dev extra)")
        self.ws = websocket.create_connection(url, timeout=DEADLINE_S, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise AssertionError(f"{method}: {msg['error']}")
                return msg.get("result") or {}
            self.events.append(msg)

    def wait_for(self, method: str) -> dict[str, Any]:
        for ev in self.events:
            if ev.get("method") == method:
                return ev
        while True:
            msg = json.loads(self.ws.recv())
            self.events.append(msg)
            if msg.get("method") == method:
                return msg

    def close(self) -> None:
        self.ws.close()


MEASURE = """JSON.stringify({
  graphics: Array.from(document.querySelectorAll('svg, img')).filter(
      e => !e.parentElement.closest('svg')).map(e => {
    const r = e.getBoundingClientRect(); return [e.tagName, r.width, r.height]; }),
  verdicts: Array.from(document.querySelectorAll('.headline h2')).map(e => e.innerText),
  text: document.body.innerText,
  links: Array.from(document.querySelectorAll('a')).length,
})"""


def test_the_report_renders_offline_in_chromium(tmp_path: Path, capsys) -> None:
    root = tmp_path / "results"
    build_store(root, failed_attempt=True)
    report = tmp_path / "report.html"
    r = gpuvet(capsys, "report", "--results", root, "-p", "h200", "-p", "beta", "-o", report)
    assert r.returncode == 0, r.output
    url = report.resolve().as_uri()
    artifacts = Path(os.environ.get("GPUVET_ARTIFACTS") or tmp_path / "artifacts")
    artifacts.mkdir(parents=True, exist_ok=True)
    with browser(tmp_path / "profile") as ws_url:
        cdp = Cdp(ws_url)
        try:
            for domain in ("Page", "Runtime", "Log", "Network"):
                cdp.call(f"{domain}.enable")
            cdp.call("Page.navigate", url=url)
            cdp.wait_for("Page.loadEventFired")
            page = json.loads(cdp.call("Runtime.evaluate", expression=MEASURE,
                                       returnByValue=True)["result"]["value"])
            shot = cdp.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
            import base64

            (artifacts / "report.png").write_bytes(base64.b64decode(shot["data"]))
        finally:
            cdp.close()
    requests = [e["params"]["request"]["url"] for e in cdp.events
                if e.get("method") == "Network.requestWillBeSent"]
    assert requests and set(requests) == {url}, requests
    errors = [e for e in cdp.events
              if (e.get("method") == "Runtime.consoleAPICalled"
                  and e["params"].get("type") in ("error", "assert"))
              or e.get("method") == "Runtime.exceptionThrown"
              or (e.get("method") == "Log.entryAdded"
                  and e["params"]["entry"].get("level") == "error")]
    assert errors == []
    graphics = page["graphics"]
    assert len(graphics) == 6, graphics
    assert all(w > 50 and h > 50 for _, w, h in graphics), graphics
    assert [v.split() for v in page["verdicts"]] == [["beta:", "NO-GO"], ["h200:", "GO"]]
    text = page["text"]
    for key in ("346.69", "277.35", "570.133.20", "580.159.04", "19.93 USD",
                "TRAIN_RESTORE_MISMATCH", "monthly above 612 h/month"):
        assert key in text, key
    assert page["links"] > 10
    assert (artifacts / "report.png").stat().st_size > 10_000


PHONE = """JSON.stringify({
  graphics: Array.from(document.querySelectorAll('svg')).filter(
      e => !e.parentElement.closest('svg')).map(e => {
    const r = e.getBoundingClientRect(); return [r.width, r.height]; }),
  ratio: Array.from(document.querySelectorAll('[id^="ratio-panel"]')).map(e => {
    const r = e.getBoundingClientRect(); return [r.width, r.height]; }),
  left_out: Array.from(document.querySelectorAll('.left-out')).map(e => e.innerText),
  overflow: document.documentElement.scrollWidth - window.innerWidth,
  text: document.body.innerText,
})"""


def _look(ws_url: str, url: str, width: int) -> dict[str, Any]:
    cdp = Cdp(ws_url)
    try:
        cdp.call("Page.enable")
        cdp.call("Emulation.setDeviceMetricsOverride", width=width, height=800,
                 deviceScaleFactor=1, mobile=width < 500)
        cdp.call("Page.navigate", url=url)
        cdp.wait_for("Page.loadEventFired")
        value = cdp.call("Runtime.evaluate", expression=PHONE, returnByValue=True)
        return json.loads(value["result"]["value"])  # type: ignore[no-any-return]
    finally:
        cdp.close()


def test_unpriced_and_poc_reports_have_no_empty_chart(tmp_path: Path, capsys) -> None:
    """Logs imported without an inventory (no price) and a PoC folder of nvidia-smi
    outputs: every chart drawn has a size, the busbw chart has its ratio panel, what has
    nothing to plot is left out with why, and a phone-width page does not scroll sideways."""
    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    logs = sorted((fixtures / "h200x2" / "nccl-tests").glob("all_reduce_8B-128M_g2_round*.log"))
    copies = tmp_path / "b"
    copies.mkdir()
    for log in logs:
        (copies / log.name).write_text(log.read_text() + "\n")
    imported = tmp_path / "imported"
    for p, files in (("A", logs), ("B", sorted(copies.iterdir()))):
        assert gpuvet(capsys, "import", "nccl-tests", "-p", p, "--results", imported,
                      *files).returncode == 0
    poc_store = tmp_path / "poc"
    assert gpuvet(capsys, "import", "poc", fixtures / "poc" / "h200x2", "-p", "lab",
                  "--results", poc_store).returncode in (0, 1)
    reports = {}
    for name, root, extra in (("unpriced", imported, ["-p", "A", "-p", "B"]),
                              ("poc", poc_store, [])):
        out = tmp_path / f"{name}.html"
        r = gpuvet(capsys, "report", "--results", root, *extra, "-o", out)
        assert r.returncode == 0, r.output
        reports[name] = out.resolve().as_uri()
    with browser(tmp_path / "profile") as ws_url:
        unpriced = _look(ws_url, reports["unpriced"], 1300)
        phone = _look(ws_url, reports["unpriced"], 375)
        poc = _look(ws_url, reports["poc"], 375)
    for page in (unpriced, phone, poc):
        assert page["graphics"] and all(w > 50 and h > 50 for w, h in page["graphics"]), page
    assert unpriced["ratio"] and all(w > 50 and h > 20 for w, h in unpriced["ratio"])
    assert any("cost per useful unit: left out" in t for t in unpriced["left_out"])
    assert "not priced" in unpriced["text"]
    assert phone["overflow"] <= 1 and poc["overflow"] <= 1  # tables scroll, paths wrap
    assert not poc["ratio"]  # one provider: no ratio to draw, and no empty panel for it


# What a reader sees at one width: the headline's place, the page's width, every line
# break inside a word (a text node's word whose glyphs lie on two lines), every element
# whose computed style lets a word break, the plots' widths, the cost totals' place.
READER = r"""(() => {
  const vw = window.innerWidth;
  const heads = document.getElementById('headlines').getBoundingClientRect();
  const first = Array.from(document.querySelectorAll('.headline')).map(e => e.innerText);
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  const scrolls = e => { for (let a = e.parentElement; a; a = a.parentElement) {
    const o = getComputedStyle(a).overflowX; if (o === 'auto' || o === 'scroll') return true; }
    return false; };
  const wide = [];
  for (const e of document.body.querySelectorAll('*')) {
    if (e.closest('svg') && e.tagName.toLowerCase() !== 'svg') continue;
    const r = e.getBoundingClientRect();
    if (r.width > 0 && r.right > vw + 1 && !scrolls(e)) wide.push(e.tagName + ' ' + r.right);
  }
  const broken = [], styled = [];
  const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const seen = new Set();
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    const el = n.parentElement;
    if (!n.textContent.trim() || el.closest('svg, style, script, title')) continue;
    if (!seen.has(el)) { seen.add(el); const cs = getComputedStyle(el);
      if (cs.overflowWrap !== 'normal' || !['normal', 'keep-all'].includes(cs.wordBreak))
        styled.push(el.tagName + ': ' + cs.overflowWrap + ' ' + cs.wordBreak); }
    const re = /[^\s-]+-?|-/g; let m;
    while ((m = re.exec(n.textContent)) !== null) {
      const range = document.createRange();
      range.setStart(n, m.index); range.setEnd(n, m.index + m[0].length);
      const tops = new Set(Array.from(range.getClientRects()).filter(r => r.width > 0)
                             .map(r => Math.round(r.top)));
      if (tops.size > 1) broken.push(m[0]);
    }
  }
  const th = Array.from(document.querySelectorAll('table[data-title="PoC cost"] th'))
    .filter(e => e.innerText.startsWith('total')).map(e => e.getBoundingClientRect().right);
  const svgs = Array.from(document.querySelectorAll('figure > svg')).map(e => {
    const r = e.getBoundingClientRect(); return [r.width, r.height]; });
  return JSON.stringify({vw, heads_bottom: heads.bottom, first, wide, broken, styled, th, svgs,
    scroll_width: document.documentElement.scrollWidth,
    body_width: document.body.getBoundingClientRect().width});
})()"""


def _read(ws_url: str, url: str, width: int, shots: Path) -> dict[str, Any]:
    import base64

    cdp = Cdp(ws_url)
    try:
        cdp.call("Page.enable")
        cdp.call("Emulation.setDeviceMetricsOverride", width=width, height=900,
                 deviceScaleFactor=1, mobile=width < 500)
        cdp.call("Page.navigate", url=url)
        cdp.wait_for("Page.loadEventFired")
        shot = cdp.call("Page.captureScreenshot", format="png")
        (shots / f"report-{width}-first-screen.png").write_bytes(base64.b64decode(shot["data"]))
        value = cdp.call("Runtime.evaluate", expression=READER, returnByValue=True)
        shot = cdp.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        (shots / f"report-{width}.png").write_bytes(base64.b64decode(shot["data"]))
        return json.loads(value["result"]["value"])  # type: ignore[no-any-return]
    finally:
        cdp.close()


def test_the_report_reads_as_a_decision_at_1400_and_400_px(tmp_path: Path, capsys) -> None:
    """The two-orders comparison (h200 delivered an H100) as a reader opens it on a
    screen and on a phone: the headlines in the first 900 px, no element wider than the
    page but inside its own scroll box, no word or number broken across lines (and no
    style that would let one break), the PoC cost totals on screen, plots full width."""
    root = two_orders_store(tmp_path / "results")
    report = tmp_path / "report.html"
    r = gpuvet(capsys, "report", "--results", root, "-p", "h100", "-p", "h200", "-o", report)
    assert r.returncode == 0, r.output
    shots = Path(os.environ.get("GPUVET_ARTIFACTS") or tmp_path / "artifacts")
    shots.mkdir(parents=True, exist_ok=True)
    with browser(tmp_path / "profile") as ws_url:
        pages = {w: _read(ws_url, report.resolve().as_uri(), w, shots) for w in (1400, 400)}
    for width, page in pages.items():
        assert page["heads_bottom"] <= 900, (width, page["heads_bottom"])
        assert page["first"][0].startswith("h200: NO-GO\ndelivered NVIDIA H100 80GB HBM3, "
                                           "ordered H200"), page["first"]
        assert all("PoC cost" in h for h in page["first"]), page["first"]
        assert page["scroll_width"] <= page["vw"], (width, page["scroll_width"])
        assert page["wide"] == [], (width, page["wide"][:10])
        assert page["styled"] == [], (width, page["styled"][:10])
        assert page["broken"] == [], (width, page["broken"][:20])
        assert page["th"] and max(page["th"]) <= page["vw"], (width, page["th"])
        assert len(page["svgs"]) == 4
        assert all(w >= page["body_width"] * 0.4 and h > 100 for w, h in page["svgs"])
    phone = pages[400]
    assert all(w >= phone["vw"] - 40 for w, _ in phone["svgs"]), phone["svgs"]  # full width
