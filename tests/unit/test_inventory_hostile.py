"""Files that must be refused with a line, quickly, however they were made."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import inventory
from orchestrator.errors import ConnectionFailed, InventoryError
from orchestrator.files import MAX_KEY_BYTES

REPO = Path(__file__).resolve().parents[2]

VALID = "providers:\n  p:\n    nodes:\n      - {name: n1, host: 192.0.2.1}\n"


def refused(tmp_path: Path, data: str | bytes) -> list[str]:
    p = tmp_path / "inv.yaml"
    if isinstance(data, str):
        p.write_text(data, encoding="utf-8")
    else:
        p.write_bytes(data)
    with pytest.raises(InventoryError) as ei:
        inventory.load(p)
    return ei.value.problems


def test_bytes_that_are_not_utf8_name_offset_and_line(tmp_path: Path) -> None:
    data = VALID.encode().replace(b"192.0.2.1", b"caf\xe9")
    got = refused(tmp_path, data)
    offset = data.index(b"\xe9")
    assert got == [f"{tmp_path / 'inv.yaml'}:4: byte {offset} (0xe9, column 29) is not UTF-8: "
                   "save the file as UTF-8"]


def test_utf8_with_bom_and_non_ascii_comments_load(tmp_path: Path) -> None:
    p = tmp_path / "inv.yaml"
    p.write_bytes(b"\xef\xbb\xbf# caf\xc3\xa9\n" + VALID.encode())
    assert inventory.load(p).nodes[0].host == "192.0.2.1"


@pytest.mark.parametrize("text, what", [
    (VALID.replace("n1,", "n1\0,"), "a NUL character at column 18"),
    (VALID.replace("n1,", "n1\x1b,"), "control character U+001B at column 18"),
])
def test_nul_and_control_characters_refused_with_line(tmp_path: Path, text: str, what: str) -> None:
    assert refused(tmp_path, text) == [f"{tmp_path / 'inv.yaml'}:4: {what}: an inventory is plain "
                                       "text"]


def test_nul_written_as_an_escape_is_refused_too(tmp_path: Path) -> None:
    got = refused(tmp_path, VALID + '    access: {env: {A: "x\\0y"}}\n')
    assert len(got) == 1 and ":5: providers.p.access.env.A: a NUL character" in got[0]


@pytest.mark.timeout(10)
def test_oversized_file_refused_before_it_is_read(tmp_path: Path) -> None:
    p = tmp_path / "inv.yaml"
    with p.open("w") as fh:
        fh.write(VALID + "# " + "x" * (10 * 1024 * 1024) + "\n")
    with pytest.raises(InventoryError, match=r"larger than 128 KiB"):
        inventory.load(p)


@pytest.mark.timeout(10)
def test_long_comment_just_under_the_limit_loads(tmp_path: Path) -> None:
    """ruamel's round-trip scanner is quadratic in a comment's length; the event parser is not."""
    p = tmp_path / "inv.yaml"
    p.write_text(VALID + "# " + "x" * (inventory.MAX_BYTES - len(VALID) - 10) + "\n")
    assert len(inventory.load(p).nodes) == 1


@pytest.mark.timeout(10)
def test_billion_laughs_refused(tmp_path: Path) -> None:
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        levels.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]")
    got = refused(tmp_path, "\n".join(levels) + "\n" + VALID)
    assert len(got) == 1 and "aliases expand the document beyond 20000 values" in got[0]


@pytest.mark.timeout(10)
def test_merge_key_bomb_refused(tmp_path: Path) -> None:
    levels = ["a0: &a0 {k0: 1, k1: 2, k2: 3, k3: 4, k4: 5, k5: 6, k6: 7, k7: 8}"]
    for i in range(1, 10):
        refs = ", ".join([f"*a{i - 1}"] * 10)
        levels.append(f"a{i}: &a{i} {{<<: [{refs}], x{i}: [{refs}]}}")
    got = refused(tmp_path, "\n".join(levels) + "\n" + VALID)
    assert len(got) == 1 and "aliases expand the document" in got[0]


def test_a_few_aliases_are_fine(tmp_path: Path) -> None:
    inv = inventory.load(_write(tmp_path, """providers:
  p:
    access: &a {user: ubuntu, env: {NCCL_DEBUG: INFO}}
    nodes: [{name: n1, host: h1}]
  q:
    access: *a
    nodes: [{name: n2, host: h2}]
"""))
    assert [n.user for n in inv.nodes] == ["ubuntu", "ubuntu"]


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "inv.yaml"
    p.write_text(text)
    return p


@pytest.mark.timeout(10)
def test_recursive_and_unknown_aliases_refused(tmp_path: Path) -> None:
    assert "alias *a refers to the value that holds it" in refused(tmp_path, "a: &a [*a]\n" + VALID)[0]
    assert "alias *b has no anchor before it" in refused(tmp_path, "a: *b\n" + VALID)[0]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("text", [
    "a: " + "[" * 60_000 + "]" * 60_000 + "\n",
    "a: " + "{a: " * 20_000 + "1" + "}" * 20_000 + "\n",
    "".join(" " * i + "a:\n" for i in range(400)),
])
def test_absurd_nesting_refused(tmp_path: Path, text: str) -> None:
    got = refused(tmp_path, text)
    assert len(got) == 1 and "nested deeper than 64 levels" in got[0]


def test_nesting_through_an_alias_counts(tmp_path: Path) -> None:
    deep = "d: &d " + "[" * 40 + "]" * 40 + "\n"
    got = refused(tmp_path, deep + "e: " + "[" * 30 + "*d" + "]" * 30 + "\n")
    assert len(got) == 1 and ":2: alias *d nests values deeper than 64 levels" in got[0]


@pytest.mark.timeout(10)
def test_too_many_values_refused(tmp_path: Path) -> None:
    got = refused(tmp_path, "x: [" + "1," * 30_000 + "1]\n")
    assert len(got) == 1 and "more than 20000 values" in got[0]


def test_tags_and_complex_keys_refused(tmp_path: Path) -> None:
    got = refused(tmp_path, VALID + "    access: {user: !!python/object:os.system ls}\n"
                                    "    expect: !!set {a: null}\n"
                                    "    ? [a, b]\n    : c\n")
    assert ":5: providers.p.access.user: YAML tag tag:yaml.org,2002:python/object:os.system is " \
           "not allowed here" in got[0]
    assert ":6: providers.p.expect: YAML tag tag:yaml.org,2002:set is not allowed here" in got[1]
    assert any(":7: providers.p: a key must be a plain value" in g for g in got)


def test_dates_and_words_are_not_silently_taken(tmp_path: Path) -> None:
    got = refused(tmp_path, VALID + "    access: {user: 2024-01-01}\n"
                                    "    expect: {mig_allowed: yes}\n")
    assert "providers.p.access.user: Input should be a valid string; got a date ('2024-01-01'; " \
           "quote it to make it text)" in got[0]
    assert "providers.p.expect.mig_allowed: Input should be a valid boolean; got 'yes'" in got[1]


# --------------------------------------------------------------------------- files ssh reads

def _ssh_inventory(tmp_path: Path, **files: str) -> Path:
    settings = "".join(f"    {k}: {v}\n" for k, v in files.items() if k != "identity_file")
    text = ("providers:\n  p:\n    access: {user: u" + (
        f", identity_file: {files['identity_file']}" if "identity_file" in files else "")
        + "}\n    nodes:\n      - {name: n1, host: 192.0.2.1}\n")
    if settings:
        text += "settings:\n" + settings
    p = tmp_path / "inv.yaml"
    p.write_text(text)
    return p


def _problems(path: Path) -> list[str]:
    with pytest.raises(InventoryError) as ei:
        inventory.load(path)
    return ei.value.problems


@pytest.mark.parametrize("key", ["identity_file", "ssh_config", "known_hosts"])
def test_a_fifo_or_a_device_named_as_an_ssh_file_is_refused_unopened(tmp_path: Path,
                                                                      key: str) -> None:
    """A FIFO would block ssh's open() for good (SIGINT and SIGTERM then wait for a worker
    stuck in a system call); /dev/zero would be read until memory runs out."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (got,) = _problems(_ssh_inventory(tmp_path, **{key: str(fifo)}))
    assert f"{key}: {fifo} is a FIFO (named pipe), not a file" in got
    (got,) = _problems(_ssh_inventory(tmp_path, **{key: "/dev/zero"}))
    assert f"{key}: /dev/zero is a character device, not a file" in got


def test_an_identity_file_past_its_limit_is_refused(tmp_path: Path) -> None:
    key = tmp_path / "key"
    with key.open("wb") as f:
        f.truncate(MAX_KEY_BYTES + 1)
    (got,) = _problems(_ssh_inventory(tmp_path, identity_file=str(key)))
    assert f"is {MAX_KEY_BYTES + 1:,} bytes, more than the 1 MiB limit" in got
    with key.open("wb") as f:
        f.truncate(MAX_KEY_BYTES)
    inventory.load(_ssh_inventory(tmp_path, identity_file=str(key)))  # at the limit: read


def test_ping_with_a_fifo_identity_file_exits_2_at_once(tmp_path: Path) -> None:
    """The audit's hang: `ping` blocked forever in open() of the FIFO. Now the inventory is
    refused before any connection; the timeout only guards the test against the old hang."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    inv = _ssh_inventory(tmp_path, identity_file=str(fifo))
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1", "COLUMNS": "200"}
    for cmd in (["inventory", "check", str(inv)], ["ping", "-i", str(inv)]):
        proc = subprocess.run([sys.executable, "-m", "orchestrator", *cmd], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"identity_file: {fifo} is a FIFO (named pipe), not a file" in proc.stderr


def test_the_ssh_executor_checks_the_key_again_before_paramiko_reads_it(tmp_path: Path) -> None:
    """The file may have become a FIFO after the inventory was loaded."""
    from orchestrator.executors import ExecutorOptions
    from orchestrator.executors.ssh import SshExecutor

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    inv = inventory.load(_ssh_inventory(tmp_path))
    node = inv.nodes[0].model_copy(update={"identity_file": str(fifo)})
    ex = SshExecutor(node, ExecutorOptions(known_hosts=str(tmp_path / "kh")))
    with pytest.raises(ConnectionFailed, match="identity_file .* is a FIFO"):
        ex._connection_for("192.0.2.1", "u", 22, str(fifo), None)
