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
