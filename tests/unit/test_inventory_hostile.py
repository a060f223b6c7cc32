"""Files that must be refused with a line, quickly, however they were made."""

from pathlib import Path

import pytest

from orchestrator import inventory
from orchestrator.errors import InventoryError

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
