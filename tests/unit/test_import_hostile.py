"""`import nccl-tests`, `import poc` and `parse` on hostile input: names that would leave the
results folder, FIFOs and devices, names that are not UTF-8, logs past the stated limits."""

from __future__ import annotations

import errno
import json
import os
import shutil
import sqlite3
import threading
from pathlib import Path

import pytest

from orchestrator.files import MAX_INPUT_BYTES
from orchestrator.parsers.nccl_tests import MAX_ROWS
from tests.unit.clirun import gpuvet

FIX = Path(__file__).resolve().parents[1] / "fixtures"
ROUNDS = [FIX / "h200x2" / "nccl-tests" / f"all_reduce_8B-128M_g2_round{r}.log" for r in (1, 2, 3)]
POC = FIX / "poc" / "h200x2"
BAD = os.fsdecode(b"log-\xff\xfe.txt")  # a name with bytes that are not UTF-8


def run_dirs(results: Path) -> list[Path]:
    return [d for d in results.iterdir() if d.is_dir()] if results.exists() else []


def one_line_error(output: str) -> str:
    errors = [ln for ln in output.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, output
    return errors[0]


# --------------------------------------------------------------------------- path traversal

@pytest.mark.parametrize("name", ["../../../../tmp/X", "../x", "/tmp/x", "a/b", "..", ".hidden",
                                  "x\n", "a\x1b[31m", os.fsdecode(b"lab\xff")])
def test_import_nccl_tests_refuses_a_provider_that_is_a_path(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    results = tmp_path / "deep" / "er" / "results"
    proc = gpuvet(capsys, "import", "nccl-tests", ROUNDS[0], "-p", name, "--results", results)
    assert proc.returncode == 2, proc.output
    line = one_line_error(proc.output)
    assert "is not a name gpuvet can file results under" in line
    assert "\x1b" not in proc.output  # a control character is shown as \x1b, never sent raw
    if name.startswith("lab"):
        assert "provider 'lab\\xff' is not a name" in line  # bytes shown, never a traceback
    assert not list(tmp_path.rglob("*"))  # refused before anything is written


def test_import_poc_refuses_the_same_names_the_same_way(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = gpuvet(capsys, "import", "poc", POC, "-p", "../x", "--results", tmp_path / "r")
    b = gpuvet(capsys, "import", "nccl-tests", ROUNDS[0], "-p", "../x", "--results",
               tmp_path / "r")
    assert a.returncode == b.returncode == 2
    assert one_line_error(a.output) == one_line_error(b.output)
    c = gpuvet(capsys, "import", "poc", POC, "-p", "lab", "-n", "../../n", "--results",
               tmp_path / "r")
    assert c.returncode == 2 and "node '../../n' is not a name" in c.output


@pytest.mark.parametrize("run_id", ["../../../etc", "20261130-201500-ab12\n", "20261130-201500-ab12/.."])
def test_resume_refuses_a_run_id_that_is_a_path(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                run_id: str) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("providers:\n  p:\n    executor: local\n    nodes: [{name: a}]\n")
    proc = gpuvet(capsys, "preflight", "-i", inv, "--resume", run_id, "--results",
                  tmp_path / "r")
    assert proc.returncode == 2, proc.output
    assert "is not a run id" in one_line_error(proc.output)


def test_the_store_refuses_a_folder_name_that_is_a_path(tmp_path: Path) -> None:
    """Every node and provider folder goes through the one name check, whoever asks."""
    from orchestrator.errors import UsageError
    from orchestrator.store import Run

    run = Run.create(tmp_path, command="x", suite_hash="h", suite={}, inventory_path=None)
    for bad in ("../../escape", "/abs", "a/b"):
        with pytest.raises(UsageError):
            run.provider_dir(bad, "nccl")
        with pytest.raises(UsageError):
            run.node_dir(bad, "preflight")
    assert not (tmp_path.parent / "escape").exists()


def test_an_output_that_cannot_be_written_is_bad_input(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """-o names a place the user chose: one that cannot be written is exit 2, one line,
    never the results disk's exit 3 or an internal error."""
    results = tmp_path / "r"
    assert gpuvet(capsys, "import", "nccl-tests", ROUNDS[0], "-p", "lab", "--results",
                  results).returncode == 0
    (run,) = run_dirs(results)
    for args in (("export", run.name, "--format", "json", "-o", "/proc/gpuvet-x.json"),
                 ("export", run.name, "-o", "/proc/gpuvet-x"),
                 ("report", "--no-cost", "-o", "/proc/gpuvet-x.html")):
        proc = gpuvet(capsys, *args, "--results", results)
        assert proc.returncode == 2, proc.output
        assert one_line_error(proc.output).startswith(f"error: -o {args[-1]}: cannot write ")


# --------------------------------------------------------------------------- FIFOs and devices

def test_import_nccl_tests_of_a_fifo_or_a_device_is_not_a_regular_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "pipe.log"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a FIFO"), (Path("/dev/zero"), "a character device")):
        proc = gpuvet(capsys, "import", "nccl-tests", path, "-p", "lab", "--results",
                      tmp_path / "r")
        assert proc.returncode == 2, proc.output
        line = one_line_error(proc.output)
        assert f"{path} is not a regular file ({kind}" in line and "no such file" not in line
        proc = gpuvet(capsys, "parse", "nccl-tests", path)
        assert proc.returncode == 2 and "is not a regular file" in proc.output
    assert not run_dirs(tmp_path / "r")


def test_preflight_from_a_fifo_is_not_a_regular_file(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "doc.json"
    os.mkfifo(fifo)
    inv = tmp_path / "inv.yaml"
    inv.write_text("providers:\n  p:\n    executor: local\n    nodes: [{name: a}]\n")
    proc = gpuvet(capsys, "preflight", "--from", fifo, "-i", inv, "--node", "a", "--results",
                  tmp_path / "r")
    assert proc.returncode == 2, proc.output
    assert "is not a regular file (a FIFO" in one_line_error(proc.output)


def test_import_poc_lists_a_fifo_and_does_not_hang(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "poc"
    shutil.copytree(POC, folder)
    os.mkfifo(folder / "stuck.fifo")
    done: list[int] = []

    def work() -> None:
        done.append(gpuvet(capsys, "import", "poc", folder, "-p", "lab", "--results",
                           tmp_path / "r").returncode)

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(120)
    if t.is_alive():  # unblock the reader, so the test process can end
        fd = os.open(folder / "stuck.fifo", os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        t.join(10)
        pytest.fail("import poc blocked on a FIFO")
    assert done == [0]
    meta = json.loads(next((tmp_path / "r").glob("*/run.json")).read_text())
    entry = meta["source"]["files"]["stuck.fifo"]
    assert entry["status"] == "unreadable"
    assert "not a regular file (a FIFO (named pipe))" in entry["reason"]


# --------------------------------------------------------------------------- nested JSON

DEEP = "[" * 100_000 + "]" * 100_000  # deeper than Python's stack: json.loads recurses
TORCH_DEEP = ('{"torch": "2.5", "cuda": null, "nccl": null, "available": false, "count": 0, '
              f'"devices": {DEEP}}}')


def test_deeply_nested_json_is_bad_input_never_a_crash(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The audit's RecursionError (exit 3) in `parse torch-info`, `preflight --from` (the
    document itself, and the torch probe's line inside it) and `import poc` (a torch.txt)."""
    torch = tmp_path / "torch.txt"
    torch.write_text(TORCH_DEEP + "\n")
    proc = gpuvet(capsys, "parse", "torch-info", torch)
    assert proc.returncode == 2, proc.output
    assert "bad torch JSON: nested too deeply" in one_line_error(proc.output)

    inv = tmp_path / "inv.yaml"
    inv.write_text("providers:\n  p:\n    executor: local\n    nodes: [{name: a}]\n")
    deep_doc = tmp_path / "deep.json"
    deep_doc.write_text(DEEP)
    proc = gpuvet(capsys, "preflight", "--from", deep_doc, "-i", inv, "--node", "a",
                  "--results", tmp_path / "r")
    assert proc.returncode == 2, proc.output
    assert one_line_error(proc.output) == f"error: cannot read {deep_doc}: JSON nested too deeply"
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps({"tool": "gpuvet-payload", "node": "a", "commands": {"torch": {
        "argv": ["python3"], "rc": 0, "stdout": TORCH_DEEP, "stderr": ""}}}))
    proc = gpuvet(capsys, "preflight", "--from", doc, "-i", inv, "--node", "a",
                  "--results", tmp_path / "r")
    assert proc.returncode in (0, 1), proc.output  # the line is a parse error of the node
    assert "internal error" not in proc.output

    folder = tmp_path / "poc"
    shutil.copytree(POC, folder)
    (folder / "torch.txt").write_text(TORCH_DEEP + "\n")
    proc = gpuvet(capsys, "import", "poc", folder, "-p", "lab", "--results", tmp_path / "r2")
    assert proc.returncode in (0, 1), proc.output
    meta = json.loads(next((tmp_path / "r2").glob("*/run.json")).read_text())
    entry = meta["source"]["files"]["torch.txt"]
    assert entry["status"] == "not recognised"
    assert "bad torch JSON: nested too deeply" in entry["reason"]


# --------------------------------------------------------------------------- paths of any length

def _deep(base: Path, length: int) -> Path:
    """Folders under `base` until the path is `length` characters, made one by one (a path
    past PATH_MAX cannot be made in one call)."""
    fd = os.open(base, os.O_RDONLY)
    path = str(base)
    try:
        while len(path) < length:
            name = "d" * min(200, length - len(path) - 1)
            os.mkdir(name, dir_fd=fd)
            sub = os.open(name, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = sub
            path += "/" + name
    finally:
        os.close(fd)
    return Path(path)


def _in_deep(base: Path, length: int, name: str, data: bytes) -> None:
    deep = _deep(base, length)
    parts = str(deep)[len(str(base)) + 1:].split("/")
    fd = os.open(base, os.O_RDONLY)
    for part in parts:
        sub = os.open(part, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = sub
    out = os.open(name, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(out, data)
    os.close(out)
    os.close(fd)


def no_run_left(results: Path) -> None:
    assert not results.exists() or not [p for p in results.iterdir()
                                        if p.name not in ("index.sqlite", ".store.lock",
                                                          ".import.lock")],\
        list(results.iterdir())
    if (results / "index.sqlite").exists():
        with sqlite3.connect(results / "index.sqlite") as db:
            assert db.execute("SELECT count(*) FROM runs").fetchone() == (0,)


def test_import_poc_of_a_folder_nested_past_path_max_is_too_long(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The audit's exit 3 (`File name too long` in the scan): the file is read by its
    name in its own folder, and its copy, longer than any path may be, is refused."""
    folder = tmp_path / "poc"
    shutil.copytree(POC, folder)
    _in_deep(folder, 4200, "nvidia-smi.txt", (POC / "nvidia-smi.txt").read_bytes())
    results = tmp_path / "r"
    proc = gpuvet(capsys, "import", "poc", folder, "-p", "lab", "--results", results)
    assert proc.returncode == 2, proc.output
    line = one_line_error(proc.output)
    assert line.startswith(f"error: {folder}/ddd") and line.endswith(
        f"/nvidia-smi.txt: too long to keep: its copy under {results} would pass the 4,095 "
        "bytes a path may have here")
    assert "nothing was stored" in proc.output and "--resume" not in proc.output
    no_run_left(results)
    assert not results.exists()
    (tmp_path / "o").mkdir()
    too_deep = str(_deep(tmp_path / "o", 4000)) + "/" + "e" * 200  # past PATH_MAX as given
    proc = gpuvet(capsys, "import", "poc", too_deep, "-p", "lab", "--results", results)
    assert proc.returncode == 2, proc.output
    assert one_line_error(proc.output) == (f"error: {too_deep}: too long (4,201 bytes, more "
                                           "than the 4,095 a path may have here)")
    assert not results.exists()


def test_import_poc_into_a_results_path_that_makes_a_copy_too_long(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The audit's second exit 3, with the hint "finish with --resume" that `import poc`
    does not have, and a run left `error` by every retry: now exit 2 before any run."""
    folder = tmp_path / "poc"
    shutil.copytree(POC, folder)
    long_name = "x" * 80 + ".txt"
    shutil.copy(POC / "nvidia-smi.txt", folder / long_name)
    results = _deep(tmp_path, 3990)  # the run's own files fit; the 84-character copy does not
    for _ in range(2):
        proc = gpuvet(capsys, "import", "poc", folder, "-p", "lab", "-n", "n1",
                      "--results", results)
        assert proc.returncode == 2, proc.output
        line = one_line_error(proc.output)
        assert line == (f"error: {folder / long_name}: too long to keep: its copy under "
                        f"{results} would pass the 4,095 bytes a path may have here"), line
        assert "--resume" not in proc.output
        no_run_left(results)
    (tmp_path / "b").mkdir()
    longer = _deep(tmp_path / "b", 4000)
    proc = gpuvet(capsys, "import", "poc", POC, "-p", "lab", "-n", "n1", "--results", longer)
    assert proc.returncode == 2, proc.output
    assert one_line_error(proc.output) == (
        f"error: --results {longer}: too long (4,000 bytes): the run's files under it would "
        "pass the 4,095 bytes a path may have here")
    no_run_left(longer)


@pytest.mark.parametrize("cut", ["full disk", "Ctrl-C"])
def test_import_poc_cut_short_leaves_no_run(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch, cut: str) -> None:
    """An import cut short after its run was made takes the run away again (it has no
    --resume): the hint names the command that finishes it, the same import, which does."""
    from orchestrator import store
    from orchestrator.files import store_error

    real = store.append_lines

    def fail(path: Path, lines: list[str], *, sync: bool = True) -> None:
        if path.name == "measurements.jsonl":
            if cut == "Ctrl-C":
                raise KeyboardInterrupt
            err = OSError(errno.ENOSPC, "No space left on device")
            raise store_error(err, path) from err
        real(path, lines, sync=sync)

    monkeypatch.setattr(store, "append_lines", fail)
    results = tmp_path / "r"
    proc = gpuvet(capsys, "import", "poc", POC, "-p", "lab", "--results", results)
    if cut == "Ctrl-C":
        assert proc.returncode == 130, proc.output
    else:
        assert proc.returncode == 3, proc.output
        assert "the results disk is full" in proc.output
        assert ("nothing of this import was stored: run the same `gpuvet import poc` again"
                in proc.output) and "--resume" not in proc.output
    no_run_left(results)
    assert not [p for p in results.iterdir() if p.name.startswith(".import")]
    monkeypatch.setattr(store, "append_lines", real)
    again = gpuvet(capsys, "import", "poc", POC, "-p", "lab", "--results", results)
    assert again.returncode in (0, 1), again.output
    (run,) = run_dirs(results)
    assert json.loads((run / "run.json").read_text())["status"] in ("passed", "failed")


# --------------------------------------------------------------------------- non-UTF-8 names

def test_import_nccl_tests_of_a_non_utf8_name(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / BAD
    shutil.copy(ROUNDS[0], log)
    results = tmp_path / "r"
    proc = gpuvet(capsys, "import", "nccl-tests", log, "-p", "lab", "--results", results)
    assert proc.returncode == 0, proc.output
    (run,) = run_dirs(results)
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "passed"
    assert meta["source"]["files"] == [str(tmp_path / "log-\\xff\\xfe.txt")]
    assert (run / "providers" / "lab" / "imported" / "round1_log-\\xff\\xfe.txt").is_file()


def test_import_nccl_tests_error_shows_a_non_utf8_name_escaped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / BAD
    log.write_text("not a log\n")
    proc = gpuvet(capsys, "import", "nccl-tests", log, "-p", "lab", "--results", tmp_path / "r")
    assert proc.returncode == 2, proc.output
    assert "log-\\xff\\xfe.txt is not an nccl-tests log" in one_line_error(proc.output)
    assert not run_dirs(tmp_path / "r")


def test_import_poc_with_non_utf8_names(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / os.fsdecode(b"poc-\xe9")
    shutil.copytree(POC, folder)
    shutil.copy(ROUNDS[0], folder / BAD)
    (folder / os.fsdecode(b"sub\xff")).mkdir()
    (folder / os.fsdecode(b"sub\xff") / "note.txt").write_text("hello\n")
    results = tmp_path / "r"
    proc = gpuvet(capsys, "import", "poc", folder, "-p", "lab", "--results", results)
    assert proc.returncode == 0, proc.output
    assert "log-\\xff\\xfe.txt" in proc.output and "sub\\xff/note.txt" in proc.output
    (run,) = run_dirs(results)
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "passed"
    assert meta["source"]["dir"].endswith("poc-\\xe9")
    assert meta["source"]["files"]["log-\\xff\\xfe.txt"]["status"] == "judged"
    findings = (run / "findings.jsonl").read_text()
    assert "sub\\\\xff/note.txt" in findings  # the unrecognised file, named escaped


# --------------------------------------------------------------------------- limits

def _rows_log(n_rows: int) -> str:
    head = ROUNDS[0].read_text().splitlines()
    start = next(i for i, ln in enumerate(head) if ln.lstrip().startswith("#  ") and
                 "size" in ln and "count" in ln) + 2
    row = head[start]
    return "\n".join(head[:start] + [row] * n_rows) + "\n"


def test_a_log_past_the_row_limit_is_refused(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "huge.log"
    log.write_text(_rows_log(MAX_ROWS + 1))
    proc = gpuvet(capsys, "import", "nccl-tests", log, "-p", "lab", "--results", tmp_path / "r")
    assert proc.returncode == 2, proc.output
    assert f"more than {MAX_ROWS:,} table rows" in one_line_error(proc.output)
    assert not run_dirs(tmp_path / "r")
    proc = gpuvet(capsys, "parse", "nccl-tests", log)
    assert proc.returncode == 2 and f"more than {MAX_ROWS:,} table rows" in proc.output


def test_a_log_at_the_row_limit_is_read(tmp_path: Path) -> None:
    from orchestrator.parsers.nccl_tests import parse_nccl_tests

    assert len(parse_nccl_tests(_rows_log(MAX_ROWS)).rows) == MAX_ROWS


def test_a_file_past_the_size_limit_is_refused_unread(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "big.log"
    with log.open("wb") as f:  # sparse: the size is what counts, nothing is read
        f.truncate(MAX_INPUT_BYTES + 1)
    for args in (("import", "nccl-tests", log, "-p", "lab", "--results", tmp_path / "r"),
                 ("parse", "nccl-tests", log)):
        proc = gpuvet(capsys, *args)
        assert proc.returncode == 2, proc.output
        assert f"more than the {MAX_INPUT_BYTES >> 20} MiB" in one_line_error(proc.output)
    assert not run_dirs(tmp_path / "r")


def test_chatter_is_listed_up_to_a_bound_then_counted() -> None:
    from orchestrator.parsers._noise import MAX_LISTED
    from orchestrator.parsers.nccl_tests import parse_nccl_tests

    text = ROUNDS[0].read_text() + "chatter\n" * (MAX_LISTED + 50)
    run = parse_nccl_tests(text)
    assert len(run.ignored_lines) == MAX_LISTED
    assert run.ignored_lines_dropped == 50 + sum(1 for i in parse_nccl_tests(
        ROUNDS[0].read_text()).ignored_lines)


def test_iter_lines_is_splitlines() -> None:
    from orchestrator.parsers._noise import iter_lines

    for text in ("", "a", "a\n", "a\r\nb\rc\x0bd\x0ce\x1cf\u2028g\n\n", "\n\n", "x\r"):
        assert list(iter_lines(text)) == text.splitlines(), repr(text)
