from pathlib import Path

import pytest

from orchestrator import inventory
from orchestrator.errors import InventoryError

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "inv.yaml"
    p.write_text(text)
    return p


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(InventoryError) as ei:
        inventory.load(write(tmp_path, text))
    assert ei.value.exit_code == 2
    return ei.value.problems


def test_shipped_examples_load() -> None:
    inv = inventory.load(REPO / "inventories/example-two-providers.yaml")
    assert list(inv.providers) == ["alpha-cloud", "beta-gpu"]
    assert [n.name for n in inv.nodes] == ["alpha-1", "alpha-2", "beta-1", "beta-2"]
    a1 = inv.node("alpha-1")
    assert (a1.user, a1.host, a1.work_dir) == ("ubuntu", "192.0.2.11", "/home/ubuntu/gpuvet")
    prov = inv.provider_of(a1)
    assert prov.expect.gpus_per_node == 8 and prov.expect.interconnect == "nvswitch"
    assert prov.expect.fabric.type == "ib" and prov.pricing and prov.pricing.gpu_hour == 1.79
    assert inv.node("beta-2").proxy_jump == "beta-bastion"
    local = inventory.load(REPO / "inventories/local.yaml")
    assert [n.env["NCCL_HOSTID"] for n in local.nodes] == ["sim-a", "sim-b"]
    assert {n.executor for n in local.nodes} == {"local"}


def test_node_overrides_provider_access(tmp_path: Path) -> None:
    inv = inventory.load(write(tmp_path, """
providers:
  p:
    access: {user: ubuntu, port: 2222, env: {A: "1", B: "2"}}
    nodes:
      - {name: n1, host: h1}
      - {name: n2, host: h2, user: root, env: {B: "3"}}
"""))
    n1, n2 = inv.nodes
    assert (n1.user, n1.port, n1.env) == ("ubuntu", 2222, {"A": "1", "B": "2"})
    assert (n2.user, n2.port, n2.env) == ("root", 2222, {"A": "1", "B": "3"})
    assert n2.target == "root@h2:2222"


def test_every_structural_problem_with_line_and_did_you_mean(tmp_path: Path) -> None:
    got = problems(tmp_path, """providers:
  p1:
    executor: sshh
    expect:
      gpu_modle: A100
    nodes:
      - name: a
        host: 1.2.3.4
      - name: b
        prot: 22
""")
    assert len(got) == 3
    assert ":3: providers.p1.executor" in got[0] and "'sshh'" in got[0]
    assert ":5: providers.p1.expect.gpu_modle: unknown key 'gpu_modle', did you mean " \
           "'gpu_model'?" in got[1]
    assert ":10: providers.p1.nodes[1].prot" in got[2] and "'port'" in got[2]


def test_semantic_problems_before_connecting(tmp_path: Path) -> None:
    got = problems(tmp_path, """providers:
  p1:
    nodes:
      - name: a
        host: 1.2.3.4
        identity_file: /nonexistent/key
      - name: a
        host: 1.2.3.5
        proxy_jump: bastian
      - name: c
jump_hosts:
  bastion: {host: 9.9.9.9}
""")
    text = "\n".join(got)
    assert "/nonexistent/key does not exist" in text
    assert "duplicate node name 'a' (first at line 4)" in text
    assert "unknown jump host 'bastian', did you mean 'bastion'?" in text
    assert "node 'c' has neither host nor ssh_alias" in text


def test_yaml_syntax_error_has_line(tmp_path: Path) -> None:
    got = problems(tmp_path, "providers:\n  p1:\n    nodes: [\n")
    assert len(got) == 1 and "YAML syntax" in got[0] and "inv.yaml:" in got[0]


def test_missing_file_and_empty_providers(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="no such file"):
        inventory.load(tmp_path / "nope.yaml")
    assert "at least one provider" in problems(tmp_path, "providers: {}\n")[0]
    assert "required key is missing" in problems(tmp_path, "settings: {}\n")[0]


def test_select_by_provider_and_name() -> None:
    inv = inventory.load(REPO / "inventories/example-two-providers.yaml")
    assert [n.name for n in inv.select(provider="beta-gpu")] == ["beta-1", "beta-2"]
    assert [n.name for n in inv.select(["alpha-2"])] == ["alpha-2"]
    with pytest.raises(InventoryError, match="no node named 'zzz'"):
        inv.select(["zzz"])
    with pytest.raises(InventoryError, match="no provider named 'x'"):
        inv.select(provider="x")
