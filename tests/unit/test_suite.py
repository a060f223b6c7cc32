"""The suite's identity (Suite.hash), which baselines and regress compare runs by."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.errors import UsageError
from orchestrator.suite import Suite, load_suite

FIXTURES = Path(__file__).parent.parent / "fixtures"


def test_a_section_added_later_leaves_the_hash_alone_at_its_defaults() -> None:
    """Runs stored before the health section existed keep their baseline: the default
    suite's hash is the one those runs stored (tests/fixtures/h200x1-train, the default
    suite with the one-GPU train parameters), and a changed health level changes it."""
    meta = next(json.loads(p.read_text()) for p in (FIXTURES / "h200x1-train").rglob("run.json"))
    stored = Suite.model_validate({k: v for k, v in meta["suite"].items() if k != "health"})
    assert stored.hash == meta["suite_hash"]
    assert Suite.model_validate({**meta["suite"], "health": {"level": "quick"}}).hash \
        != meta["suite_hash"]


def test_a_fleet_field_added_later_leaves_the_hash_alone_at_its_default() -> None:
    """`fleet.rails_nccl` came after suites with a fleet section were stored: at false such
    a suite keeps the hash it had (b800d04be3a6c631, computed before the field existed)."""
    fleet = {"engine": "torch", "partners": 3}
    assert Suite.model_validate({"fleet": fleet}).hash == "b800d04be3a6c631"
    assert Suite.model_validate({"fleet": {**fleet, "rails_nccl": True}}).hash \
        != "b800d04be3a6c631"
    assert Suite().hash == Suite.model_validate({}).hash  # no fleet section: nothing to drop


# --------------------------------------------------------------------------- the suite file

ROOT = Path(__file__).resolve().parents[2]

# The audit's 11-line bomb: 4 GB and 36 s before exit 2 with a plain safe load. Nine levels
# of nine expand to 9**9 values; the reader counts an alias at its expanded weight and stops
# at MAX_VALUES, without building anything.
BOMB = "\n".join(["name: bomb", "a: &a [x, x, x, x, x, x, x, x, x]"] + [
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi", strict=True)]
    + ["nccl: {iters: *i}", ""])


def _suite(tmp_path: Path, text: str | bytes) -> Path:
    p = tmp_path / "suite.yaml"
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return p


def _refused(path: Path) -> str:
    with pytest.raises(UsageError) as ei:
        load_suite(path)
    return str(ei.value)


def test_the_shipped_suites_load_with_the_hashes_they_had() -> None:
    assert load_suite(ROOT / "suites" / "default.yaml").hash == "719fcba1d20e5499"
    assert load_suite(ROOT / "suites" / "train-cpu.yaml").hash == "a58e945508921c6f"


def test_an_alias_bomb_suite_is_refused_before_it_grows(tmp_path: Path) -> None:
    assert len(BOMB.splitlines()) == 11
    msg = _refused(_suite(tmp_path, BOMB))
    assert msg.startswith(f"suite {tmp_path / 'suite.yaml'}:6: aliases expand the document "
                          "beyond 20000 values"), msg


@pytest.mark.parametrize(("text", "said"), [
    ("nccl:\n" + "  " * 0 + "x: " + "[" * 70 + "]" * 70 + "\n", "nested deeper than 64 levels"),
    ("a: 1\n---\nb: 2\n", "a suite is one document"),
    ("name: x\n" + "#" * (130 << 10) + "\n", "larger than 128 KiB, far more than a suite needs"),
    (b"name: \x00\n", "a NUL character at column 7: a suite is plain text"),
    ("name: x\nname: y\n", "suite.yaml:2: duplicate key 'name' (first at line 1)"),
    ("name: !!python/object:os.system x\n", "YAML tag tag:yaml.org,2002:python/object:os.system"),
])
def test_a_suite_gets_the_inventorys_limits(tmp_path: Path, text: str | bytes, said: str) -> None:
    assert said in _refused(_suite(tmp_path, text))


def test_a_fifo_or_a_device_as_suite_is_refused_unopened(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert "not a regular file" in _refused(fifo)
    assert "not a regular file" in _refused(Path("/dev/zero"))
    assert _refused(tmp_path / "nope.yaml") == f"no such suite file: {tmp_path / 'nope.yaml'}"


def test_a_plain_suite_still_loads(tmp_path: Path) -> None:
    s = load_suite(_suite(tmp_path, "name: mine\nnccl: &n {iters: 7}\n"
                                    "train: {model: tiny, steps: 12, timeout_s: 30}\n"))
    assert (s.name, s.nccl.iters, s.train.steps, s.train.timeout_s) == ("mine", 7, 12, 30.0)
    assert load_suite(_suite(tmp_path, "")) == Suite()


def test_the_kept_saves_manifest_is_hashed_behind_only_for_a_kill_at_a_later_commit() -> None:
    """A kill at a step or at a save's start can land before the kept checkpoint's
    manifest if that is hashed beside the training: only the before-manifest kill, at the
    later save's commit, lets the rank program overlap it."""
    from orchestrator.suite import TrainParams

    assert TrainParams().payload_params()["manifest_behind"] is True
    for kill in ("after-step", "mid-save"):
        assert TrainParams(kill=kill).payload_params()["manifest_behind"] is False
