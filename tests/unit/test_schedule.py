"""schedule print: a systemd service and timer, and the same in one crontab line."""

from __future__ import annotations

import datetime
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


# ---------------------------------------------------------------- on a Slurm cluster


def _slurm(tmp_path: Path, every: str = "6h", options: tuple[str, ...] = ("--nodes=2",),
           argv: list[str] | None = None) -> tuple[str, str, Path]:
    path = tmp_path / "gv.sbatch"
    s = schedule(Every.parse(every), argv or ["/opt/gpuvet", "pipeline", "-i", "/x/inv 1.yaml"],
                 name="gv", workdir=tmp_path, user=None, log_file=Path("/logs/g%v.log"),
                 inventory=Path("/x/inv 1.yaml"), sbatch_options=options, sbatch_file=path)
    return s.scrontab, s.sbatch, path


def test_the_scrontab_entry_has_its_options_before_the_line(tmp_path: Path) -> None:
    entry, _, _ = _slurm(tmp_path)
    lines = entry.splitlines()
    assert lines[1:8] == ["#SCRON --job-name=gv", "#SCRON --time=355", "#SCRON --exclusive",
                          "#SCRON --output=/logs/g%%v.log", "#SCRON --open-mode=append",
                          "#SCRON --nodes=2",
                          f"0 */6 * * * cd {tmp_path} && COLUMNS=160 /opt/gpuvet pipeline -i "
                          "'/x/inv 1.yaml'"]
    assert lines[0].startswith("# scrontab -e (needs ScronParameters=enable")


def test_the_sbatch_script_is_bash_and_says_how_to_submit_and_stop_it(tmp_path: Path) -> None:
    _, script, path = _slurm(tmp_path)
    assert script.startswith("#!/bin/bash\n")
    assert f"#   mkdir -p /logs && sbatch {path}" in script
    assert "# Stop the series: scancel --name=gv" in script
    directives = [ln for ln in script.splitlines() if ln.startswith("#SBATCH")]
    assert directives == ["#SBATCH --job-name=gv", "#SBATCH --time=355", "#SBATCH --exclusive",
                          "#SBATCH --output=/logs/g%%v.log", "#SBATCH --open-mode=append",
                          "#SBATCH --nodes=2"]
    # sbatch reads #SBATCH lines only before the first command
    first_command = next(i for i, ln in enumerate(script.splitlines())
                         if ln and not ln.startswith("#"))
    assert all(script.splitlines().index(d) < first_command for d in directives)
    path.write_text(script)
    res = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize(("every", "hours"), [("6h", {0, 6, 12, 18}), ("1d", {0})])
def test_the_script_queues_its_next_run_first_then_runs_the_pipeline(
        tmp_path: Path, every: str, hours: set[int]) -> None:
    """Run as Slurm would run it, with sbatch and gpuvet standing in: the next run is
    queued at the next multiple of the interval since midnight, never beside this one
    (singleton), and then the pipeline runs in the working folder with its environment."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/sbatch.args\n')
    gpuvet_fake = bin_dir / "gpuvet"
    gpuvet_fake.write_text(f'#!/bin/sh\npwd > {tmp_path}/ran\nprintf "%s\\n" "$COLUMNS" "$@" '
                           f'>> {tmp_path}/ran\nexit 1\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    _, script, path = _slurm(tmp_path, every, argv=[str(gpuvet_fake), "pipeline", "-i",
                                                    "/x/inv 1.yaml"])
    path.write_text(script)
    started = datetime.datetime.now().replace(microsecond=0)
    res = subprocess.run(["bash", str(path)], cwd="/", capture_output=True, text=True,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, timeout=30)
    assert res.returncode == 1, res.stderr  # the pipeline's own exit code
    begin, dependency, again = (tmp_path / "sbatch.args").read_text().splitlines()
    assert (dependency, again) == ("--dependency=singleton", str(path))
    when = datetime.datetime.strptime(begin, "--begin=%Y-%m-%dT%H:%M:%S")
    assert (when.hour, when.minute, when.second) in {(h, 0, 0) for h in hours}
    assert started < when <= started + datetime.timedelta(minutes=Every.parse(every).minutes)
    assert (tmp_path / "ran").read_text().splitlines() == [
        str(tmp_path), "160", "pipeline", "-i", "/x/inv 1.yaml"]


@pytest.mark.parametrize("bad", ["--comment=a b", "partition=gpu", "--x=#1", "--nodes=2\n#X"])
def test_an_sbatch_option_that_is_not_one_option_is_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(UsageError, match="is not one sbatch option"):
        _slurm(tmp_path, options=(bad,))


def test_schedule_print_gives_the_slurm_forms_too(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    inv = REPO / "inventories" / "local.yaml"
    res = gpuvet(capsys, "schedule", "print", "--every", "1h", "-i", inv, "--sbatch-option",
                 "--partition=gpu", "--json")
    assert res.returncode == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["sbatch_file"] == str(tmp_path / "gpuvet-pipeline.sbatch")
    assert "#SCRON --partition=gpu" in doc["scrontab"] and "#SBATCH --time=55" in doc["sbatch"]
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written or submitted
    r = gpuvet(capsys, "schedule", "print", "--every", "1h", "-i", inv, "--sbatch-option",
               "--partition gpu")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.splitlines()[0] == ("error: --sbatch-option '--partition gpu' is not one "
                                        "sbatch option as --name=value (no spaces, no '#')")
