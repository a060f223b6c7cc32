"""`gpuvet claim`: exactly the provider-side FAILs, their evidence with the right sha256,
no secret from an inventory or a log, nothing half-written, bad input exit 2."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from orchestrator.report import claim
from tests.unit import fleetstore as F
from tests.unit.clirun import gpuvet
from tests.unit.testkeys import aws_key_pair, frame_and_body, private_key
from tests.unit.twoorders import two_orders_store


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    tmp = tmp_path_factory.mktemp("claim")
    root = tmp / "results"
    pem = private_key()
    _, aws_secret = aws_key_pair()
    inv_secret = "hf_" + aws_secret.replace("/", "x").replace("+", "y")
    # the log of the Xid carries a private key and a token, the inventory a token
    ids = F.fleet_store(root, tmp, log_secret=f"{inv_secret}\n{pem}",
                        inventory_secret=aws_secret)
    assert aws_secret in (tmp / "inventory.yaml").read_text()
    return {"root": root, "ids": ids, "secrets": [aws_secret, inv_secret,
                                                  *frame_and_body(pem)[1]], "tmp": tmp}


@pytest.fixture(scope="module")
def bundle(store, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    dest = tmp_path_factory.mktemp("out") / "claim"
    from orchestrator.cli import run  # in-process: its lines go to pytest's capture

    rc = run(["claim", "-p", "acme", "--results", str(store["root"]), "-o", str(dest)])
    return dest, int(rc), (dest / "claim.md").read_text()


def test_a_claim_holds_exactly_the_provider_side_fails(store, bundle) -> None:
    dest, rc, md = bundle
    assert rc == 1
    doc = json.loads((dest / "claim.json").read_text())
    assert sorted((i["code"], i["node"]) for i in doc["items"]) == [("GPU_XID", "n3"),
                                                                    ("HEALTH_MEMBW", "n3")]
    assert doc["setup_side_fails_left_out"] == 1
    for text in (md, (dest / "claim.html").read_text(), json.dumps(doc)):
        assert "TRAIN_OOM" not in text  # the setup's: never in a claim
    membw = next(i for i in doc["items"] if i["code"] == "HEALTH_MEMBW")
    gpu = F.gpu("n3", 1)
    assert membw["gpu"] == {"index": 1, "uuid": gpu["uuid"], "serial": gpu["serial"],
                            "pci_bus_id": gpu["pci_bus_id"]}
    assert membw["expected_vs_measured"] == {"value": 1210.4, "expected": 2680.0,
                                             "datasheet": 3350.0, "variant": "H100 SXM5 80GB"}
    assert "gpu_peaks.yaml" in membw["source"]
    assert membw["billed"] == "6 GPU-hours (2 GPU(s) x 3 h), 15.00 USD"
    # each node's hours once, however many FAILs it has
    assert doc["billed_per_node"] == {"n3": membw["billed"]}
    assert "| n3 | 6 GPU-hours (2 GPU(s) x 3 h), 15.00 USD |" in md
    assert membw["started"] == F.TIMES["health"][0]
    xid = next(i for i in doc["items"] if i["code"] == "GPU_XID")
    assert xid["xid"]["action"] == "RESTART_BM" and xid["xid"]["source"].startswith(
        "https://docs.nvidia.com/deploy/xid-errors/")
    assert f"serial {gpu['serial']}" in md and "recommends RESTART_BM" in md


def test_evidence_is_beside_it_with_its_sha256(store, bundle) -> None:
    dest, _, md = bundle
    doc = json.loads((dest / "claim.json").read_text())
    run_dir = Path(str(store["root"])) / str(store["ids"]["health"])
    evidence = [e for i in doc["items"] for e in i["evidence"]]
    assert len(evidence) == 2
    for e in evidence:
        data = (dest / e["path"]).read_bytes()
        assert e["sha256"] == hashlib.sha256(data).hexdigest()
        assert e["sha256"] in md
    membw = next(e for e in evidence if e["path"].endswith("gpu1.jsonl"))
    original = (run_dir / "nodes/n3/health/gpu1.jsonl").read_bytes()
    assert membw["sha256"] == hashlib.sha256(original).hexdigest() and not membw["note"]
    log = next(e for e in evidence if e["path"].endswith("dmesg.txt"))
    assert log["note"].startswith("scrubbed")
    assert "GPU has fallen off the bus" in (dest / log["path"]).read_text()


def test_no_secret_of_an_inventory_or_a_log_is_in_the_claim(store, bundle) -> None:
    dest, _, _ = bundle
    files = [p for p in dest.rglob("*") if p.is_file()]
    assert len(files) == 5
    # the secrets are really in the store: the claim is what scrubs them
    raw = (Path(str(store["root"])) / str(store["ids"]["health"])
           / "nodes/n3/health/counters/after/dmesg.txt").read_text()
    assert all(s in raw for s in store["secrets"][1:])  # type: ignore[attr-defined]
    for p in files:
        text = p.read_text()
        for secret in store["secrets"]:  # type: ignore[attr-defined]
            assert secret not in text, (p, secret)


def test_bad_input_is_exit_2_and_nothing_is_half_written(store, tmp_path, capsys) -> None:
    root = store["root"]
    full = tmp_path / "full"
    full.mkdir()
    (full / "mine.txt").write_text("keep me")
    r = gpuvet(capsys, "claim", "-p", "acme", "--results", root, "-o", full)
    assert r.returncode == 2 and "exists and is not an empty folder" in r.stderr
    assert [p.name for p in full.iterdir()] == ["mine.txt"]
    r = gpuvet(capsys, "claim", "-p", "acm", "--results", root, "-o", tmp_path / "x")
    assert r.returncode == 2 and "did you mean" in r.stderr
    r = gpuvet(capsys, "claim", "-p", "acme", "--results", root, "-o", tmp_path / "x",
               "20990101-000000-beef")
    assert r.returncode == 2 and "no run 20990101-000000-beef" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]


def test_a_failure_while_writing_leaves_nothing(store, tmp_path, monkeypatch) -> None:
    c = claim.build(Path(str(store["root"])), "acme")

    def broken(*a: object, **k: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(claim, "atomic_write", broken)
    with pytest.raises(OSError):
        claim.write(c, Path(str(store["root"])), tmp_path / "claim")
    assert list(tmp_path.iterdir()) == []


def test_named_runs_without_fails_claim_nothing(store, tmp_path) -> None:
    c = claim.build(Path(str(store["root"])), "acme", [str(store["ids"]["preflight"])])
    assert c.items == [] and c.left_out == 0
    files = claim.write(c, Path(str(store["root"])), tmp_path / "empty")
    assert "nothing to claim" in (tmp_path / "empty" / "claim.md").read_text()
    assert len(files) == 3


def test_the_xid_table_has_the_common_xids() -> None:
    assert set(claim.XID_ACTIONS) == {13, 31, 43, 45, 48, 61, 62, 63, 64, 74, 79, 92, 94, 95,
                                      119, 120}
    assert claim.xid_action(95)["action"] == "RESET_GPU"
    assert claim.xid_action(7)["action"] == ""


def test_values_are_escaped_for_each_page(store, tmp_path) -> None:
    c = claim.build(Path(str(store["root"])), "acme")
    it = c.items[0]
    it.finding = it.finding.model_copy(update={"message": "<script>x</script> | *bold*"})
    claim.write(c, Path(str(store["root"])), tmp_path / "c")
    page = (tmp_path / "c" / "claim.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    md = (tmp_path / "c" / "claim.md").read_text()
    assert r"\<script\>x\</script\> \| \*bold\*" in md


def test_the_two_orders_fixture_claims_the_wrong_card(tmp_path) -> None:
    """The real runs: provider h200 was given an H100. Its claim names the card by the
    serial nvidia-smi -q -x recorded; h100's runs have nothing to claim."""
    root = two_orders_store(tmp_path / "results")
    c = claim.build(root, "h200")
    assert sorted(it.finding.code for it in c.items) == ["GPU_MODEL", "TORCH_ORDER"]
    files = claim.write(c, root, tmp_path / "h200")
    md = (tmp_path / "h200" / "claim.md").read_text()
    assert "serial 1651424018701" in md and "GPU-635aa559-342d-fd8a-25a8-4c949a188422" in md
    doc = json.loads((tmp_path / "h200" / "claim.json").read_text())
    for e in (e for i in doc["items"] for e in i["evidence"]):
        assert hashlib.sha256((tmp_path / "h200" / e["path"]).read_bytes()).hexdigest() == \
            e["sha256"]
    assert len(files) == 6
    assert claim.build(root, "h100").items == []
