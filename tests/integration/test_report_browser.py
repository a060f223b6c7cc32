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
  verdicts: Array.from(document.querySelectorAll('.card')).map(e => e.innerText),
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
    assert [v.split() for v in page["verdicts"]] == [["h200", "GO"], ["beta", "NO-GO"]]
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
