"""schedule print: a systemd service and timer, and the same in one crontab line."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator.errors import UsageError
from orchestrator.schedule import Every, schedule, systemd_quote, timeout_min
from tests.unit.clirun import gpuvet

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("every", "calendar", "cron"), [
    ("6h", "*-*-* 00/6:00:00", "0 */6 * * *"),
    ("1h", "*-*-* 00/1:00:00", "0 * * * *"),
    ("1d", "*-*-* 00:00:00", "0 0 * * *"),
    ("24h", "*-*-* 00:00:00", "0 0 * * *"),
    ("30m", "*-*-* *:00/30:00", "*/30 * * * *"),
    ("120m", "*-*-* 00/2:00:00", "0 */2 * * *"),
])
def test_intervals_both_express_exactly(every: str, calendar: str, cron: str) -> None:
    e = Every.parse(every)
    assert (e.calendar, e.cron) == (calendar, cron)
    if shutil.which("systemd-analyze"):
        res = subprocess.run(["systemd-analyze", "calendar", calendar], capture_output=True,
                             text=True)
        assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("bad", ["5h", "7m", "0h", "2d", "90m", "6", "h", "six hours"])
def test_intervals_cron_cannot_keep_are_refused(bad: str) -> None:
    with pytest.raises(UsageError, match="--every"):
        Every.parse(bad)


@pytest.mark.parametrize("short", ["3m", "5m", "10m", "12m"])
def test_an_interval_shorter_than_a_run_s_time_limit_is_refused(short: str) -> None:
    """`--every 3m` gave a timer whose `timeout 5m` outlasted the interval: runs overlapped."""
    with pytest.raises(UsageError, match=rf"--every {short} is shorter than a run's time limit"):
        Every.parse(short)
    shortest = Every.parse("15m")
    assert timeout_min(shortest) == 10 < shortest.minutes
    for every in ("15m", "20m", "30m", "1h", "6h", "1d"):
        e = Every.parse(every)
        assert timeout_min(e) == e.minutes - 5  # the margin before the next start


def test_schedule_print_refuses_a_short_interval_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = REPO / "inventories" / "local.yaml"
    r = gpuvet(capsys, "schedule", "print", "--every", "3m", "-i", inv)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines()[0] == (
        "error: --every 3m is shorter than a run's time limit (10 min at least) plus a "
        "5-minute margin: runs would overlap or be killed before they end")


def test_values_are_quoted_for_systemd_and_the_shell() -> None:
    assert systemd_quote("/a/b.yaml") == "/a/b.yaml"
    assert systemd_quote("/data/my results/x") == '"/data/my results/x"'
    assert systemd_quote("50%$HOME") == '"50%%$$HOME"'
    s = schedule(Every.parse("6h"), ["/opt/gpuvet", "pipeline", "-i", "/x/inv 1.yaml",
                                     "--prom-file", "/p/a%b.prom"],
                 name="gv", workdir=Path("/srv"), user="ops", log_file=Path("/var/log/gv.log"),
                 inventory=Path("/x/inv 1.yaml"))
    assert 'ExecStart=/opt/gpuvet pipeline -i "/x/inv 1.yaml" --prom-file /p/a%%b.prom' \
        in s.service
    assert s.cron.startswith("0 */6 * * * mkdir -p /var/log && cd /srv && COLUMNS=160 timeout "
                             "--kill-after=90s 355m /opt/gpuvet pipeline -i '/x/inv 1.yaml'")
    assert "TimeoutStartSec=355min" in s.service and "Environment=COLUMNS=160" in s.service
    assert "/p/a\\%b.prom" in s.cron and s.cron.endswith(">> /var/log/gv.log 2>&1")
    with pytest.raises(UsageError, match="unit name"):
        schedule(Every.parse("1h"), ["x"], name="a b", workdir=Path("/"), user=None,
                 log_file=Path("/l"), inventory=Path("/i"))


def test_schedule_print_gives_units_systemd_accepts_and_installs_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    inv = REPO / "inventories" / "local.yaml"
    res = gpuvet(capsys, "schedule", "print", "--every", "6h", "-i", inv, "--results", "res",
                 "--prom-file", tmp_path / "g.prom", "--json")
    assert res.returncode == 0, res.output
    doc = json.loads(res.stdout)
    service, timer, cron = doc["service"], doc["timer"], doc["cron"]
    exec_start = next(line for line in service.splitlines() if line.startswith("ExecStart="))
    argv = shlex.split(exec_start.removeprefix("ExecStart="))
    assert argv[0].startswith("/") and argv[1:4] == ["pipeline", "-i", str(inv)]
    assert argv[4:] == ["--results", str(tmp_path / "res"), "--prom-file",
                        str(tmp_path / "g.prom")]
    assert f"WorkingDirectory={tmp_path}" in service and "Type=oneshot" in service
    assert "StandardOutput=journal" in service and "SyslogIdentifier=gpuvet-pipeline" in service
    assert "OnCalendar=*-*-* 00/6:00:00" in timer and "Persistent=true" in timer
    assert "Unit=gpuvet-pipeline.service" in timer and "WantedBy=timers.target" in timer
    fields = cron.split(" ", 5)
    assert fields[:5] == ["0", "*/6", "*", "*", "*"]
    words = shlex.split(fields[5])
    log = tmp_path / "state" / "gpuvet" / "pipeline.log"
    assert words[:7] == ["mkdir", "-p", str(log.parent), "&&", "cd", str(tmp_path), "&&"]
    # the service's environment and time limit, and a log a non-root user can write
    assert words[7:11] == ["COLUMNS=160", "timeout", "--kill-after=90s", "355m"]
    assert "TimeoutStartSec=355min" in service
    assert fields[5].endswith(f">> {log} 2>&1")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, nothing installed
    if shutil.which("systemd-analyze"):
        (tmp_path / "gpuvet-pipeline.service").write_text(service)
        (tmp_path / "gpuvet-pipeline.timer").write_text(timer)
        res2 = subprocess.run(["systemd-analyze", "verify", "gpuvet-pipeline.service",
                               "gpuvet-pipeline.timer"], capture_output=True, text=True,
                              cwd=tmp_path)
        assert res2.returncode == 0, res2.stderr
    text = gpuvet(capsys, "schedule", "print", "--every", "30m", "-i", inv).stdout
    assert "# --- gpuvet-pipeline.timer" in text and "*/30 * * * *" in text


def test_schedule_print_refuses_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    inv = REPO / "inventories" / "local.yaml"
    for args, msg in ((["--every", "5h", "-i", inv], "divide an hour"),
                      (["--every", "6h", "-i", tmp_path / "none.yaml"], "no inventory"),
                      (["--every", "6h", "-i", inv, "--prom-file", tmp_path / "x.txt"],
                       ".prom")):
        res = gpuvet(capsys, "schedule", "print", *args)
        assert res.returncode == 2, res.output
        assert msg in res.stderr
