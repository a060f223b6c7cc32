"""PyTorch's view against the order (TORCH_ORDER) and the NVLink fabric (FABRIC_STATE)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from collectdoc import H200_ORDER, h200_doc, h200_text, inventory

from orchestrator.inventory import Expectations
from orchestrator.parsers.nvidia_smi_q import parse_nvidia_smi_q
from orchestrator.parsers.recipe import parse_torch_check
from orchestrator.records import Finding
from orchestrator.steps.preflight import checks
from orchestrator.steps.preflight.gpu_state import check_fabric_state, check_torch_order
from orchestrator.steps.preflight.step import judge_document
from orchestrator.suite import PreflightParams

FIX = Path(__file__).resolve().parents[1] / "fixtures"
PUBLIC = FIX / "public"
TORCH = (FIX / "recipe-h200x1" / "torch.txt").read_text()


def judge(doc: dict[str, Any], expect: dict[str, Any]) -> list[Finding]:
    inv = inventory(expect, nodes=["node-a"])
    return judge_document(doc, inv.node("node-a"), inv, "run-1", None).findings


def of(fs: list[Finding], code: str) -> list[Finding]:
    return [f for f in fs if f.code == code]


def torch_facts(text: str = TORCH) -> checks.NodeFacts:
    return checks.NodeFacts(node="n", provider="p", doc={}, facts={"torch": parse_torch_check(text)},
                            evidence={"torch": "raw/torch.txt"})


@pytest.mark.parametrize(("expect", "wrong"), [
    ({"gpus_per_node": 1, "gpu_model": "H200", "memory_per_gpu_gb": 141}, []),
    ({"gpus_per_node": 8}, ["1 GPU(s), 8 ordered"]),
    ({"gpu_model": "H100"}, ["GPU0 is NVIDIA H200, H100 ordered"]),
    ({"memory_per_gpu_gb": 192}, ["GPU0 has 139.8 GiB, 192 GB ordered"]),
])
def test_pytorch_s_devices_against_the_order(expect: dict[str, Any], wrong: list[str]) -> None:
    (r,) = check_torch_order(torch_facts(), Expectations(**expect), PreflightParams())
    assert (r.code, r.severity, r.details["wrong"]) == ("TORCH_ORDER",
                                                        "FAIL" if wrong else "PASS", wrong)
    assert r.evidence == ["raw/torch.txt"]


def test_pytorch_without_cuda_fails_the_order() -> None:
    text = ("torch_version: 2.5.1+cpu\ntorch_cuda: None\ncuda_available: False\n"
            "device_count: 0\n")
    (r,) = check_torch_order(torch_facts(text), Expectations(gpus_per_node=1), PreflightParams())
    assert r.severity == "FAIL"
    assert r.details["wrong"] == ["CUDA is not available to PyTorch (a CPU-only build)",
                                  "0 GPU(s), 1 ordered"]
    assert r.message.endswith("(it sees no GPU)")


def test_nothing_ordered_nothing_judged() -> None:
    assert check_torch_order(torch_facts(), Expectations(), PreflightParams()) == []


def q_facts(*names: str) -> checks.NodeFacts:
    facts = {f"nvidia_smi_q{i or ''}": parse_nvidia_smi_q((PUBLIC / n).read_text())
             for i, n in enumerate(names)}
    return checks.NodeFacts(node="n", provider="p", doc={}, facts=dict(facts),
                            evidence={k: f"raw/{k}.txt" for k in facts})


@pytest.mark.parametrize(("name", "why"), [
    ("nvidia-smi-q_fabric-insufficient-resources_azhpc.txt", "GPU0: Status Insufficient Resources"),
    ("nvidia-smi-q_fabric-in-progress_gpu-operator.txt", "GPU0: State In Progress"),
    ("nvidia-smi-q_fabric-grep-C3-unhealthy_dra-driver.txt", "GPU0: Health Summary Unhealthy"),
])
def test_an_unregistered_fabric_fails_where_nvswitch_was_ordered(name: str, why: str) -> None:
    (r,) = check_fabric_state(q_facts(name), Expectations(interconnect="nvswitch"),
                              PreflightParams())
    assert (r.code, r.severity) == ("FABRIC_STATE", "FAIL")
    assert r.message.startswith(f"nvswitch ordered but the NVLink fabric has not registered 1 "
                                f"GPU(s) ({why})")
    assert r.evidence == ["raw/nvidia_smi_q.txt"]


def test_the_fabric_is_not_judged_where_pcie_was_ordered() -> None:
    nf = q_facts("nvidia-smi-q_fabric-in-progress_gpu-operator.txt")
    assert check_fabric_state(nf, Expectations(interconnect="pcie"), PreflightParams()) == []
    assert check_fabric_state(nf, Expectations(), PreflightParams()) == []


def test_a_gpu_without_a_fabric_says_nothing() -> None:
    nf = q_facts("nvidia-smi-q_titan-v_r560.txt")
    assert check_fabric_state(nf, Expectations(interconnect="nvlink"), PreflightParams()) == []


def test_the_real_host_s_fabric_passes_and_a_broken_one_fails() -> None:
    (ok,) = of(judge(h200_doc(), H200_ORDER), "FABRIC_STATE")
    assert (ok.severity, ok.message) == ("PASS", "every GPU registered with the NVLink fabric "
                                                 "(2 GPU(s): State Completed, Status Success)")
    xml = h200_text("nvidia_smi_q_xml").replace("<state>Completed</state>",
                                                "<state>In Progress</state>", 1)
    (bad,) = of(judge(h200_doc(texts={"nvidia_smi_q_xml": xml}), H200_ORDER), "FABRIC_STATE")
    assert bad.severity == "FAIL" and "GPU0: State In Progress, Status Success" in bad.message
    assert bad.details == {"gpus": {"0": "State In Progress, Status Success"}}
