from pathlib import Path

import pytest

from orchestrator import inventory
from orchestrator.errors import InventoryError

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests/fixtures/inventories"


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
    # the README's quick start: one node per offer, reached as `ssh HOST` would (no user
    # set: ssh_config's or the login name), only the hosts to replace
    inv = inventory.load(REPO / "inventories/example-two-providers.yaml")
    assert list(inv.providers) == ["alpha-cloud", "beta-gpu"]
    assert [(n.name, n.host) for n in inv.nodes] == [("alpha-1", "192.0.2.11"),
                                                      ("beta-1", "198.51.100.21")]
    a1 = inv.node("alpha-1")
    assert (a1.user, a1.identity_file, a1.work_dir) == (None, None, "/tmp/gpuvet")
    prov = inv.provider_of(a1)
    assert prov.expect.gpus_per_node == 8 and prov.expect.interconnect == "nvswitch"
    assert prov.expect.fabric.type == "ib" and prov.pricing and prov.pricing.gpu_hour == 1.79
    assert inv.provider_of(inv.node("beta-1")).expect.fabric.type == "roce"
    local = inventory.load(REPO / "inventories/local.yaml")
    assert [n.env["NCCL_HOSTID"] for n in local.nodes] == ["sim-a", "sim-b"]
    assert {n.executor for n in local.nodes} == {"local"}
    inventory.load(REPO / "inventories/h200x2-local.yaml")
    # the one-GPU host's inventory is the one its captured run used
    one = inventory.load(REPO / "inventories/h200-local.yaml")
    ran = inventory.load(REPO / "tests/fixtures/h200x1-train/one-run/inventory.yaml")
    assert [(n.name, n.provider, n.work_dir, n.ckpt_dir, n.executor) for n in one.nodes] == [
        (n.name, n.provider, n.work_dir, n.ckpt_dir, n.executor) for n in ran.nodes]
    assert one.provider_of(one.nodes[0]).expect == ran.provider_of(ran.nodes[0]).expect


def test_fleet_of_32_nodes_merges_provider_defaults() -> None:
    inv = inventory.load(FIXTURES / "fleet-32.yaml")
    assert len(inv.nodes) == 32
    g1 = inv.node("gamma-01")
    assert (g1.user, g1.python, g1.proxy_jump, g1.connect_timeout_s) == (
        "ubuntu", "/usr/bin/python3", "gamma-bastion", 7.5)
    assert g1.env == {"NCCL_IB_HCA": "mlx5", "NCCL_SOCKET_IFNAME": "bond0"}
    d1, d16 = inv.node("delta-01"), inv.node("delta-16")
    assert d1.connect_timeout_s == 0.5 and isinstance(d1.connect_timeout_s, float)
    assert d1.target == "root@[2001:db8::1]:2200" and d16.target == "root@2001:db8::10"
    bands = inv.provider_of(g1).expect.nccl_busbw
    assert isinstance(bands, list) and bands[0].size == "8G"


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


def test_every_problem_at_once_sorted_by_line_each_once() -> None:
    """Structural and semantic problems together, in file order; the shared access block once."""
    path = FIXTURES / "every-problem.yaml"
    with pytest.raises(InventoryError) as ei:
        inventory.load(path)
    got = [p.replace(str(path), "FILE", 1) for p in ei.value.problems]
    assert got == (FIXTURES / "every-problem.expected").read_text().splitlines()
    lines = [int(p.split(":")[1]) for p in got]
    assert lines == sorted(lines)
    assert len(got) == len(set(got))


def test_access_problem_reported_once_where_written(tmp_path: Path) -> None:
    """A bad value in a provider's access is one problem at its line, not one per node."""
    got = problems(tmp_path, """providers:
  p:
    access:
      identity_file: /nonexistent/key
      port: 0
      proxy_jump: nowhere
    nodes:
      - {name: n1, host: h1}
      - {name: n2, host: h2}
      - {name: n3, host: h3}
""")
    assert [g.split(": ", 1)[0].rsplit(":", 1)[1] for g in got] == ["4", "5", "6"]
    assert "providers.p.access.identity_file: /nonexistent/key does not exist" in got[0]
    assert "providers.p.access.port" in got[1]
    assert "providers.p.access.proxy_jump: unknown jump host 'nowhere'" in got[2]


def test_aliases_and_merge_keys_report_where_the_value_is_written(tmp_path: Path) -> None:
    got = problems(tmp_path, """providers:
  p:
    access: &common
      port: 70000
    nodes:
      - &n1 {name: n1, host: h1, connect_timeout_s: -1}
      - {<<: *n1, name: n2}
  q:
    access: *common
    nodes:
      - {name: q1, host: h3}
""")
    assert len(got) == 2, got
    assert ":4: providers.p.access.port" in got[0]
    assert ":6: providers.p.nodes[0].connect_timeout_s" in got[1]


def test_merge_key_values_are_used(tmp_path: Path) -> None:
    inv = inventory.load(write(tmp_path, """providers:
  p:
    nodes:
      - &n1 {name: n1, host: h1, port: 2222, user: ubuntu}
      - {<<: *n1, name: n2, user: root}
"""))
    n2 = inv.node("n2")
    assert (n2.host, n2.port, n2.user) == ("h1", 2222, "root")


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


def test_duplicate_keys_and_second_documents(tmp_path: Path) -> None:
    got = problems(tmp_path, "providers:\n  p:\n    nodes: [{name: n, host: h}]\n"
                             "    nodes: [{name: m, host: h}]\n")
    assert got == [f"{tmp_path / 'inv.yaml'}:4: providers.p.nodes: duplicate key 'nodes' "
                   "(first at line 3)"]
    got = problems(tmp_path, "providers: {p: {nodes: [{name: n, host: h}]}}\n---\nx: 1\n")
    assert len(got) == 1 and ":2: a second YAML document" in got[0]


def test_missing_file_and_empty_providers(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="no such file"):
        inventory.load(tmp_path / "nope.yaml")
    with pytest.raises(InventoryError, match="not a regular file"):
        inventory.load(tmp_path)
    assert "at least one provider" in problems(tmp_path, "providers: {}\n")[0]
    assert "required key is missing" in problems(tmp_path, "settings: {}\n")[0]
    assert "expected a mapping" in problems(tmp_path, "# only a comment\n")[0]
    assert "expected a mapping" in problems(tmp_path, "- providers\n")[0]
