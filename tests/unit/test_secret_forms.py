"""Every form a secret is written in, planted where users put it, searched for in everything
gpuvet stores and prints; and the harmless values that look like secrets, which must survive.

Two tables: PLANTED (one row per form: the text as a person writes it and the pieces of
it that must never come out) and HARMLESS (one row per allow-list rule: a value that
must stay, and a real secret in the same key shape that must still go). The planted rows
go into an nccl-tests log, a PoC folder (as contents and as file names), a training
command, a suite with a typo, and a file `gpuvet parse` reads; then the results folder
(every file, its names and the index), findings.jsonl, `show --json`, `runs --json`, every
export, the terminal, `parse` output and the error messages are searched for every piece.
Values are made when the tests run: no key or token sits in the repository.
"""

from __future__ import annotations

import json
import secrets
import shutil
import string
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.store import Run
from payload.scrub import (
    REDACTED,
    keeps,
    redact_value,
    scrub_argv,
    scrub_doc,
    scrub_env_list,
    scrub_text,
)
from tests.unit.clirun import CliResult, gpuvet
from tests.unit.testkeys import armored, aws_key_pair, frame_and_body, private_key, putty_key

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LOG = FIXTURES / "h200x2" / "nccl-tests" / "all_reduce_8B-128M_g2_round1.log"
POC = FIXTURES / "poc" / "h200x2"
INVENTORY = Path(__file__).resolve().parents[2] / "inventories" / "example-two-providers.yaml"


def _u(n: int = 12) -> str:
    return uuid.uuid4().hex[:n]


def _alnum(n: int) -> str:
    abc = string.ascii_letters + string.digits
    return "".join(secrets.choice(abc) for _ in range(n - 3)) + "Aa1"


@dataclass(frozen=True)
class Planted:
    kind: str
    text: str  # as a person writes it (one line or a block)
    pieces: tuple[str, ...]  # what must never come out


def planted() -> list[Planted]:
    _, aws_secret = aws_key_pair()
    hf = "hf_" + _alnum(34)
    pem = private_key("openssh")
    rsa = private_key("rsa")
    putty = putty_key()
    putty_lines = putty.splitlines()
    ssh2 = armored("---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----",
                   "---- END SSH2 ENCRYPTED PRIVATE KEY ----", ('Comment: "rsa-key-test"',))
    pgp = armored("-----BEGIN PGP PRIVATE KEY BLOCK-----", "-----END PGP PRIVATE KEY BLOCK-----",
                  ("", ))
    s = {k: f"pl{k}{_u()}" for k in ("colon", "json1", "json2", "yaml", "auth", "xapi",
                                     "mysqlp", "pwflag", "pwflag2", "mysqlpwd", "url1a",
                                     "url1b", "url2a", "url2b", "nested", "cookie",
                                     "bearer", "ini", "flowyaml")}
    key_id = secrets.token_hex(20)
    return [
        Planted("KEY: value", f"HF_TOKEN: {s['colon']}", (s["colon"],)),
        Planted("~/.aws/credentials", f"aws_secret_access_key = {aws_secret}", (aws_secret,)),
        Planted("INI key = value", f"db_password = {s['ini']}", (s["ini"],)),
        Planted("JSON private_key_id", f'  "private_key_id": "{key_id}",', (key_id,)),
        Planted("JSON client_secret", f'{{"client_secret": "{s["json1"]}", "x": 1}}',
                (s["json1"],)),
        Planted("JSON password", f'"password":"{s["json2"]}"', (s["json2"],)),
        Planted("YAML password", f"  password: {s['yaml']}", (s["yaml"],)),
        Planted("YAML flow", f"{{user: ci, password: {s['flowyaml']}}}", (s["flowyaml"],)),
        Planted("Authorization: token", f"Authorization: token {s['auth']}", (s["auth"],)),
        Planted("Authorization: Bearer", f"curl -H 'Authorization: Bearer {s['bearer']}x'",
                (s["bearer"],)),
        Planted("X-API-Key", f"X-API-Key: {s['xapi']}", (s["xapi"],)),
        Planted("Cookie", f"Cookie: sid={s['cookie']}; theme=dark", (s["cookie"],)),
        Planted("mysql -pPW", f"mysql -u root -p{s['mysqlp']} shop", (s["mysqlp"],)),
        Planted("--password X", f"mysqldump --password {s['pwflag']} shop", (s["pwflag"],)),
        Planted("--password=X", f"psql --password={s['pwflag2']} -h db", (s["pwflag2"],)),
        Planted("MYSQL_PWD", f"MYSQL_PWD={s['mysqlpwd']} mysql shop", (s["mysqlpwd"],)),
        Planted("export HF_TOKEN", f"export HF_TOKEN={hf}", (hf, hf[3:])),
        Planted("URL password with /", f"pip install -i https://ci:{s['url1a']}/{s['url1b']}"
                "@mirror.example.com/simple x", (s["url1a"], s["url1b"])),
        Planted("URL password with @", f"git clone https://ci:{s['url2a']}@{s['url2b']}"
                "@git.example.com/r.git", (s["url2a"], s["url2b"])),
        Planted("nested a=b=c", f"AZ_CLIENT=client_secret={s['nested']}", (s["nested"],)),
        Planted("PEM block", pem, tuple(frame_and_body(pem)[1])),
        Planted("RSA PEM block", rsa, tuple(frame_and_body(rsa)[1])),
        Planted("PuTTY key", putty, (putty_lines[7], putty_lines[8].split()[1])),
        Planted("SSH2 key", ssh2, tuple(ssh2.splitlines()[2:-1])),
        Planted("PGP key block", pgp, tuple(pgp.splitlines()[2:-1])),
    ]


@dataclass(frozen=True)
class Harmless:
    rule: str
    kept: str  # NAME=value that stays as written
    scrubbed: str  # the same key shape holding a real secret, which goes
    secret: str  # the piece of `scrubbed` that must go
    # the rule exempts a value from the long-blob rule, which only an environment
    # variable's value gets (free text keeps long runs: hashes, paths, UUIDs)
    blob_rule: bool = False


def harmless() -> list[Harmless]:
    blob = _alnum(40)
    hf = "hf_" + _alnum(30)
    return [
        Harmless("commit hash in a commit's key", f"GIT_COMMIT={secrets.token_hex(20)}",
                 f"GIT_COMMIT={blob}", blob, blob_rule=True),
        Harmless("id in an id's key", f"RUN_ID={secrets.token_hex(16)}", f"RUN_ID={blob}", blob,
                 blob_rule=True),
        Harmless("image digest", "IMAGE=nvcr.io/nvidia/pytorch@sha256:"
                 + secrets.token_hex(32), f"IMAGE=nvcr.io/nvidia/pytorch@sha256:{blob}", blob,
                 blob_rule=True),
        Harmless("a tokenizer is no token", "TOKENIZERS_PARALLELISM=false",
                 f"TOKENIZER_TOKEN=tk{_u()}", "tk"),
        Harmless("tokenizer name", "TOKENIZER_NAME=gpt2", f"TOKENIZER_NAME={hf}", hf),
        Harmless("a tokenizer is no token", "TOKENIZER=meta-llama/Llama-3.1-8B",
                 f"TOKENIZER={hf}", hf),
        Harmless("count: a number", "MAX_TOKENS=4096", f"MAX_TOKENS=pw{_u()}", "pw"),
        Harmless("count: a number", "PASS_COUNT=3", f"PASS_COUNT=pw{_u()}", "pw"),
        Harmless("name: a plain name", "SESSION_NAME=nightly-7", f"SESSION_NAME={blob}", blob),
        Harmless("mode: one word", "AUTH_MODE=none", f"AUTH_MODE=Pw#{_u()}!", "Pw#"),
        Harmless("prefix: a path", "KEY_PREFIX=runs/", f"KEY_PREFIX={blob}", blob),
        Harmless("lookup key", "CACHE_KEY=nccl-2.28", f"CACHE_API_KEY=k{_u()}", "=k"),
    ]


PLANTED = planted()
HARMLESS = harmless()


def leaks(text: str, rows: list[Planted] = PLANTED) -> list[str]:
    return [f"{p.kind}: {piece[:8]}..." for p in rows for piece in p.pieces if piece in text]


def all_planted_text() -> str:
    return "\n".join(p.text for p in PLANTED) + "\n"


# --- the scrubber on each form ---------------------------------------------------------

@pytest.mark.parametrize("row", PLANTED, ids=[p.kind for p in PLANTED])
def test_each_form_is_scrubbed_line_for_line(row: Planted) -> None:
    text = f"before\n{row.text}\nafter\n"
    out = scrub_text(text)
    assert leaks(out, [row]) == []
    assert out.count("\n") == text.count("\n")  # a scrubbed line stays a line
    assert out.startswith("before\n") and out.endswith("\nafter\n")
    assert REDACTED in out
    assert scrub_text(out) == out  # scrubbing again changes nothing


# ids stable across test workers: some kept values are made when the tests run
@pytest.mark.parametrize("row", HARMLESS, ids=[f"{i}-{h.kept.split('=')[0]}"
                                               for i, h in enumerate(HARMLESS)])
def test_each_harmless_value_stays_and_its_secret_twin_goes(row: Harmless) -> None:
    name, _, value = row.kept.partition("=")
    for text in (row.kept, f"export {row.kept}", f"{name}: {value}", f'"{name}": "{value}"'):
        assert scrub_text(text) == text
    assert redact_value(name, value) == value
    assert scrub_env_list([row.kept]) == [row.kept]
    assert scrub_doc({name: value}) == {name: value}
    # the same key shape holding a real secret is scrubbed
    twin_name, _, twin_value = row.scrubbed.partition("=")
    assert row.secret not in str(redact_value(twin_name, twin_value))
    assert row.secret not in scrub_env_list([row.scrubbed])[0]
    if not row.blob_rule:
        assert row.secret not in scrub_text(row.scrubbed)
        assert row.secret not in json.dumps(scrub_doc({twin_name: twin_value}))


def test_keeps_reads_the_last_word_of_the_name() -> None:
    assert keeps("PASS_COUNT", "3") and not keeps("PASS_COUNT", "three3")
    assert keeps("AUTH_MODE", "none") and not keeps("AUTH_MODE", "a b")
    assert not keeps("DB_PASSWORD", "3") and not keeps("HF_TOKEN", "false")


def test_a_command_line_as_a_list() -> None:
    pw, tok = f"pw{_u()}", f"tk{_u()}"
    argv = ["torchrun", "train.py", "--password", pw, "--hf-token", tok, "--lr", "3",
            "-p", "22"]
    out = scrub_argv(argv)
    assert pw not in out and tok not in out and out[-4:] == ["--lr", "3", "-p", "22"]
    assert scrub_argv(["mysql", "-u", "root", f"-p{pw}", "shop"]) == \
        ["mysql", "-u", "root", f"-p{REDACTED}", "shop"]


# --- everything gpuvet stores and prints -------------------------------------------------

def stored(results: Path) -> str:
    """Every byte of every file under the results folder and every path name in it."""
    parts = []
    for p in sorted(results.rglob("*")):
        parts.append(str(p.relative_to(results)))
        if p.is_file():
            parts.append(p.read_bytes().decode("utf-8", "replace"))
    return "\n".join(parts)


def exported(capsys: pytest.CaptureFixture[str], results: Path, run_id: str,
             tmp_path: Path) -> str:
    import pandas as pd

    texts = []
    for fmt in ("csv", "json", "parquet"):
        dest = tmp_path / f"export-{fmt}"
        res = gpuvet(capsys, "export", run_id, "--format", fmt, "-o", dest,
                     "--results", results)
        assert res.returncode == 0, res.output
        texts.append(res.output)
        for f in ([dest] if dest.is_file() else sorted(dest.iterdir())):
            texts.append(f.name)
            texts.append(str(pd.read_parquet(f).to_dict()) if fmt == "parquet"
                         else f.read_text())
    return "\n".join(texts)


def shown_again(capsys: pytest.CaptureFixture[str], results: Path, run_id: str) -> str:
    outs: list[CliResult] = [
        gpuvet(capsys, "show", run_id, "--results", results, "--verbose"),
        gpuvet(capsys, "show", run_id, "--results", results, "--json"),
        gpuvet(capsys, "runs", "--results", results, "--json"),
        gpuvet(capsys, "index", "rebuild", "--results", results),
    ]
    assert all(o.returncode == 0 for o in outs), [o.output for o in outs]
    return "\n".join(o.output for o in outs)


def only_run(results: Path) -> Path:
    (run,) = [p for p in results.iterdir() if p.is_dir()]
    return run


def test_an_imported_log_holds_no_secret_anywhere(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The planted lines before the log's table (read past as noise, so quoted by the
    NCCL_LOG_NOISE finding) and the log named after a token."""
    log_text = all_planted_text() + LOG.read_text() + "copied by hand, 14:02\n"
    hf_name = "hf_" + _alnum(30)
    log = tmp_path / f"{hf_name}.log"
    log.write_text(log_text)
    results = tmp_path / "results"
    res = gpuvet(capsys, "import", "nccl-tests", log, "-p", "lab", "--results", results,
                 "--verbose")
    assert res.returncode == 0, res.output
    run = only_run(results)
    findings = [json.loads(x) for x in (run / "findings.jsonl").read_text().splitlines()]
    (noise,) = [f for f in findings if f["code"] == "NCCL_LOG_NOISE"]  # read and quoted
    (copy,) = [p for p in (run / "providers" / "lab" / "imported").iterdir()
               if p.name != "done.json"]
    # the copy keeps every line (the key blocks' too), so the lines findings cite hold
    kept = copy.read_text().splitlines()
    assert len(kept) == len(log_text.splitlines()) and kept[-1] == "copied by hand, 14:02"
    assert noise["evidence"] == [str(copy.relative_to(run))]
    everything = "\n".join([res.output, stored(results), shown_again(capsys, results, run.name),
                            exported(capsys, results, run.name, tmp_path)])
    assert leaks(everything) == []
    assert hf_name not in everything and hf_name[3:] not in everything


def test_a_key_block_keeps_the_lines_findings_cite(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    pem = private_key("rsa")
    log = tmp_path / "round.log"
    log.write_text(f"ssh-add - <<EOF\n{pem}\nEOF\n{LOG.read_text()}copied by hand, 14:02\n")
    results = tmp_path / "results"
    assert gpuvet(capsys, "import", "nccl-tests", log, "-p", "lab", "--results",
                  results).returncode == 0
    run = only_run(results)
    findings = [json.loads(x) for x in (run / "findings.jsonl").read_text().splitlines()]
    (noise,) = [f for f in findings if f["code"] == "NCCL_LOG_NOISE"]
    cited = noise["details"]["lines"]
    assert cited[0] == 1 and len(cited) == len(pem.splitlines()) + 3  # all of it, cited
    kept = (run / noise["evidence"][0]).read_text().splitlines()
    assert kept[cited[-1] - 1] == "copied by hand, 14:02"
    assert kept[cited[-2] - 1] == "EOF" and kept[1].startswith("-----BEGIN RSA PRIVATE KEY")
    assert not set(frame_and_body(pem)[1]) & set(kept)


def test_a_poc_folder_holds_no_secret_anywhere(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The planted lines inside a judged log and in a note; files named after secrets."""
    folder = tmp_path / "poc"
    shutil.copytree(POC, folder)
    first_log = sorted(folder.glob("*.log"))[0]
    first_log.write_text(all_planted_text() + first_log.read_text())
    (folder / "notes.txt").write_text(all_planted_text())
    hf_name, pw = "hf_" + _alnum(30), f"pw{_u()}"
    (folder / f"{hf_name}.txt").write_text("nothing to see\n")
    (folder / f"password={pw}.txt").write_text(all_planted_text())
    results = tmp_path / "results"
    res = gpuvet(capsys, "import", "poc", folder, "-p", "lab", "--results", results,
                 "--verbose")
    assert res.returncode in (0, 1), res.output
    run = only_run(results)
    copies = {p.name: p for p in run.rglob("raw/poc/*")}
    assert "notes.txt" in copies  # kept (scrubbed), line for line
    assert copies["notes.txt"].read_text().count("\n") == all_planted_text().count("\n")
    everything = "\n".join([res.output, stored(results), shown_again(capsys, results, run.name),
                            exported(capsys, results, run.name, tmp_path)])
    assert leaks(everything) == []
    for piece in (hf_name, hf_name[3:], pw):
        assert piece not in everything


def test_parse_prints_no_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "saved.log"
    log.write_text(all_planted_text() + LOG.read_text())
    plain = gpuvet(capsys, "parse", "nccl-tests", log)
    as_json = gpuvet(capsys, "parse", "nccl-tests", log, "--json")
    assert plain.returncode == as_json.returncode == 0, plain.output + as_json.output
    ignored = json.loads(as_json.stdout)["ignored_lines"]
    assert len(ignored) >= len(PLANTED)  # they were read past and listed ...
    assert leaks(plain.output + as_json.output) == []  # ... scrubbed


def test_error_messages_quote_no_secret(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    # a file that is no nccl-tests log: the error quotes its first line
    hf_name = "hf_" + _alnum(30)
    bad = tmp_path / f"{hf_name}.log"
    bad.write_text(all_planted_text())
    res = gpuvet(capsys, "import", "nccl-tests", bad, "-p", "lab", "--results",
                 tmp_path / "r")
    assert res.returncode == 2 and "not an nccl-tests log" in res.stderr, res.output
    # a suite with a typo'd key: pydantic quotes the value it refused, cut at its ends
    tok = "hf_" + _alnum(40)
    suite = tmp_path / "suite.yaml"
    # (pydantic shows a long value's first and last 24 characters: here the token's tail,
    # which no rule can tell from any other text)
    suite.write_text("train:\n  comand: python train.py --config configs/nightly.yaml "
                     f"HF_TOKEN={tok}\n")
    typo = gpuvet(capsys, "train", "-i", INVENTORY, "--suite", suite, "--results",
                  tmp_path / "r2")
    assert typo.returncode == 2 and "train.comand" in typo.stderr, typo.output
    # --debug shows the traceback, scrubbed like every line printed
    debug = gpuvet(capsys, "--debug", "import", "nccl-tests", bad, "-p", "lab", "--results",
                   tmp_path / "r")
    assert debug.returncode == 2 and "Traceback" in debug.stderr, debug.output
    out = res.output + typo.output + debug.output
    assert leaks(out) == []
    for piece in (hf_name[3:], tok[3:13], tok[-10:]):
        assert piece not in out


def test_a_parse_error_quotes_a_key_line_scrubbed() -> None:
    """A body line of a key block is a secret only after its BEGIN line: the line an error
    quotes is scrubbed as the text before it says."""
    from orchestrator.errors import ParseError

    pem = private_key("openssh")
    body = frame_and_body(pem)[1]
    text = f"hello\n{pem}\nafter\n"
    exc = ParseError("nccl-tests", f"unknown text {body[1]!r}", line_no=4, line=body[1],
                     source="hf_" + "Ab1" * 8 + ".log")
    shown = str(exc.scrubbed(text))
    assert body[1] not in shown and "line: '***'" in shown and ":4: " in shown
    assert "Ab1Ab1" not in shown
    assert exc.scrubbed("plain\n").line == scrub_text(body[1])  # a line the text lacks


def test_a_training_command_is_stored_scrubbed(tmp_path: Path) -> None:
    """The suite in run.json and the index, and supervise.json's argv."""
    command = " && ".join(p.text for p in PLANTED if "\n" not in p.text)
    results = tmp_path / "results"
    run = Run.create(results, command="train", suite_hash="0" * 16,
                     suite={"train": {"command": command}}, inventory_path=None)
    run.save_meta()
    argv = ["sh", "-c", command] + [p.text for p in PLANTED]
    supervise = scrub_doc({"argv": scrub_argv(argv), "tool": "gpuvet-train-supervise"})
    assert leaks(stored(results)) == []
    assert leaks(json.dumps(supervise)) == []


def stored_unscrubbed(results: Path, message: str) -> Run:
    """A run whose finding was stored before a form was known to the scrubber: written as
    it is, past `records.finding`."""
    from orchestrator.records import Finding

    run = Run.create(results, command="import nccl-tests", suite_hash="0" * 16, suite={},
                     inventory_path=None, providers=["lab"])
    raw = Finding(run_id=run.run_id, scope="provider", node=None, provider="lab",
                  step="nccl", code="NCCL_LOG_NOISE", severity="INFO", message=message,
                  evidence=[], details={"line": message})
    run.add_findings([raw])
    run.finish("passed")
    return run


def test_what_the_store_holds_from_before_is_scrubbed_on_the_way_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    run = stored_unscrubbed(results, "read past: " + " | ".join(
        p.text for p in PLANTED if "\n" not in p.text))
    assert leaks((run.dir / "findings.jsonl").read_text())  # the test plants what it seeks
    out = "\n".join([shown_again(capsys, results, run.run_id),
                     exported(capsys, results, run.run_id, tmp_path)])
    assert leaks(out) == []


def test_csv_shows_control_characters_escaped_parquet_keeps_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pandas as pd

    name = "NVIDIA H200\x1b[2J\x07\u202egpu"
    results = tmp_path / "results"
    run = stored_unscrubbed(results, f"GPU name {name}")
    csv, parquet = tmp_path / "x.csv", tmp_path / "x.parquet"
    for fmt, dest in (("csv", csv), ("parquet", parquet)):
        res = gpuvet(capsys, "export", run.run_id, "--format", fmt, "-o", dest,
                     "--results", results)
        assert res.returncode == 0, res.output
    text = tmp_path.joinpath("x.findings.csv").read_text()
    assert "GPU name NVIDIA H200\\x1b[2J\\x07\\u202egpu" in text
    assert not [c for c in text if ord(c) < 32 and c not in "\n\r\t" or c == "\u202e"]
    messages = pd.read_parquet(tmp_path / "x.findings.parquet")["message"].tolist()
    assert messages == [f"GPU name {name}"]


def test_harmless_values_survive_the_import(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    lines = [f"export {h.kept}" for h in HARMLESS]
    log = tmp_path / "round.log"
    log.write_text("\n".join(lines) + "\n" + LOG.read_text())
    results = tmp_path / "results"
    res = gpuvet(capsys, "import", "nccl-tests", log, "-p", "lab", "--results", results)
    assert res.returncode == 0, res.output
    (copy,) = [p for p in (only_run(results) / "providers" / "lab" / "imported").iterdir()
               if p.name != "done.json"]
    kept = copy.read_text()
    parsed = gpuvet(capsys, "parse", "nccl-tests", log, "--json")
    for h in HARMLESS:
        assert h.kept in kept, h.rule
        assert h.kept in parsed.stdout, h.rule


if __name__ == "__main__":  # pragma: no cover - a table to read
    for p in PLANTED:
        sys.stdout.write(f"{p.kind:28} {scrub_text(p.text).splitlines()[0]}\n")
