"""Values that look plausible to YAML but would mislead or endanger a run."""

from pathlib import Path

import pytest

from orchestrator import inventory
from orchestrator.errors import InventoryError

HEAD = "providers:\n  p:\n"


def load(tmp_path: Path, text: str) -> inventory.Inventory:
    p = tmp_path / "inv.yaml"
    p.write_text(text)
    return inventory.load(p)


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(InventoryError) as ei:
        load(tmp_path, text)
    return [p.split(": ", 1)[1] if p.startswith(str(tmp_path)) else p for p in ei.value.problems]


def node_with(field: str, value: str) -> str:
    return HEAD + f"    nodes:\n      - name: n1\n        host: 192.0.2.1\n        {field}: {value}\n"


# --- numbers ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, where", [
    (node_with("port", "true"), "providers.p.nodes[0].port"),
    (node_with("port", "'22'"), "providers.p.nodes[0].port"),
    (node_with("port", "22.0"), "providers.p.nodes[0].port"),
    (node_with("connect_timeout_s", "true"), "providers.p.nodes[0].connect_timeout_s"),
    ("settings: {concurrency: true}\n" + node_with("port", "22"), "settings.concurrency"),
    ("version: true\n" + node_with("port", "22"), "version"),
    (node_with("port", "22") + "    expect: {gpus_per_node: true}\n",
     "providers.p.expect.gpus_per_node"),
    (node_with("port", "22") + "    expect: {memory_per_gpu_gb: false}\n",
     "providers.p.expect.memory_per_gpu_gb"),
    (node_with("port", "22") + "    expect: {fabric: {nics: true}}\n",
     "providers.p.expect.fabric.nics"),
    (node_with("port", "22") + "    expect: {pcie: {min_gen: true}}\n",
     "providers.p.expect.pcie.min_gen"),
    (node_with("port", "22") + "    pricing: {gpu_hour: true}\n", "providers.p.pricing.gpu_hour"),
    (node_with("port", "22") + "    pricing: {gpu_hour: 1, node_month: false}\n",
     "providers.p.pricing.node_month"),
    (node_with("port", "22") + "    pricing: {gpu_hour: .nan}\n", "providers.p.pricing.gpu_hour"),
    (node_with("port", "22") + "    pricing: {gpu_hour: .inf}\n", "providers.p.pricing.gpu_hour"),
    (node_with("port", "22") + "    jump_hosts_typo: 1\n", "providers.p.jump_hosts_typo"),
])
def test_booleans_strings_and_non_finite_values_are_not_numbers(tmp_path: Path, text: str,
                                                                 where: str) -> None:
    got = problems(tmp_path, text)
    assert len(got) == 1 and got[0].startswith(where + ": "), got


def test_integers_are_fine_where_decimals_are_meant(tmp_path: Path) -> None:
    inv = load(tmp_path, node_with("connect_timeout_s", "3") + "    pricing: {gpu_hour: 2}\n")
    assert inv.nodes[0].connect_timeout_s == 3.0
    prov = inv.providers["p"]
    assert prov.pricing is not None and prov.pricing.gpu_hour == 2.0


@pytest.mark.parametrize("value, ok", [("0", False), ("-1", False), ("3601", False),
                                       ("0.3", True), ("0.05", True)])
def test_connect_timeout_positive_and_fractions_kept(tmp_path: Path, value: str, ok: bool) -> None:
    text = node_with("connect_timeout_s", value)
    if not ok:
        assert problems(tmp_path, text)[0].startswith("providers.p.nodes[0].connect_timeout_s: ")
        return
    t = load(tmp_path, text).nodes[0].connect_timeout_s
    assert t == float(value) and isinstance(t, float)


# --- paths and programs ------------------------------------------------------------------------

@pytest.mark.parametrize("field", ["python", "work_dir", "ckpt_dir", "identity_file", "user"])
@pytest.mark.parametrize("value", ['""', '"   "'])
def test_empty_paths_programs_and_users(tmp_path: Path, field: str, value: str) -> None:
    assert problems(tmp_path, node_with(field, value)) == [
        f"providers.p.nodes[0].{field}: must not be empty"]


@pytest.mark.parametrize("field", ["known_hosts", "ssh_config"])
def test_empty_settings_paths(tmp_path: Path, field: str) -> None:
    assert problems(tmp_path, f"settings: {{{field}: ''}}\n" + node_with("port", "22")) == [
        f"settings.{field}: must not be empty"]


def test_option_like_paths(tmp_path: Path) -> None:
    got = problems(tmp_path, node_with("python", "-c"))
    assert got == ["providers.p.nodes[0].python: '-c' starts with '-', which a command would read "
                   "as an option"]
    assert problems(tmp_path, node_with("user", "-oProxyCommand=x"))[0].startswith(
        "providers.p.nodes[0].user: '-oProxyCommand=x' is not a user name")


# --- hosts ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["192.0.2.1", "2001:db8::1", "fe80::1%eth0", "gpu-01.example.com",
                                  "gpu-01.example.com.", "my_alias", "localhost", "h100x8"])
def test_hosts_that_are_hosts(tmp_path: Path, host: str) -> None:
    text = HEAD + f"    nodes: [{{name: n, host: '{host}', ssh_alias: '{host}'}}]\n"
    assert load(tmp_path, text).nodes[0].host == host


@pytest.mark.parametrize("host, why", [
    ("-oProxyCommand=touch /tmp/x", "starts with '-'"),
    ("gpu 1", "holds ' '"),
    ("gpu1;reboot", "holds ';'"),
    ("$(reboot)", "holds '$' '(' ')'"),
    ("`id`", "holds '`'"),
    ("a|b", "holds '|'"),
    ("300.1.2.3", "not a valid IPv4 address"),
    ("10.0.0", "not a valid IPv4 address"),
    ("fe80::1::2", "not a valid IPv6 address"),
    ("[2001:db8::1]", "holds '[' ']'"),
    ("ubuntu@gpu1", "put the user in `user:`"),
    ("-gpu.example.com", "starts with '-'"),
    ("gpu-.example.com", "is not a hostname"),
    ("a" * 64 + ".example.com", "is not a hostname"),
])
@pytest.mark.parametrize("field", ["host", "ssh_alias"])
def test_hosts_that_are_not(tmp_path: Path, host: str, why: str, field: str) -> None:
    text = HEAD + f"    nodes: [{{name: n, {field}: '{host}'}}]\n"
    got = problems(tmp_path, text)
    assert len(got) == 1 and got[0].startswith(f"providers.p.nodes[0].{field}: ") and why in got[0]


def test_jump_host_and_provider_access_hosts_checked(tmp_path: Path) -> None:
    got = problems(tmp_path, "jump_hosts:\n  j: {host: 'a b'}\n" + HEAD +
                   "    access: {host: 'x;y'}\n    nodes: [{name: n}]\n")
    assert [g.split(":")[0] for g in got] == ["jump_hosts.j.host", "providers.p.access.host"]


# --- environment -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["A=B", "A B", "A;B", "1A", "A-B", "", "A$B"])
def test_env_names_that_are_not_names(tmp_path: Path, name: str) -> None:
    got = problems(tmp_path, node_with("env", f"{{'{name}': x}}"))
    assert got == [f"providers.p.nodes[0].env.{name}: {name!r} is not an environment variable name "
                   "(letters, digits and '_', not starting with a digit)"]


def test_env_names_that_are_names(tmp_path: Path) -> None:
    env = load(tmp_path, node_with("env", "{_X: '1', NCCL_DEBUG: INFO, a1: 'yes'}")).nodes[0].env
    assert env == {"_X": "1", "NCCL_DEBUG": "INFO", "a1": "yes"}
    assert problems(tmp_path, node_with("env", "{A: 1}")) == [
        "providers.p.nodes[0].env.A: Input should be a valid string; got 1"]


# --- provider names ----------------------------------------------------------------------------------

def test_provider_name_must_be_its_key(tmp_path: Path) -> None:
    text = ("providers:\n  p:\n    name: q\n    nodes: [{name: n1, host: h1}]\n"
            "  q:\n    nodes: [{name: n2, host: h2}]\n")
    assert problems(tmp_path, text) == [
        "providers.p.name: name 'q' differs from its key 'p': a provider is known by its key; "
        "drop `name:` or write 'p'; 'q' is also the name of provider 'q' (line 5)"]
    text = HEAD + "    name: other\n    nodes: [{name: n1, host: h1}]\n"
    assert problems(tmp_path, text)[0].startswith("providers.p.name: name 'other' differs from its key")
    load(tmp_path, HEAD + "    name: p\n    nodes: [{name: n1, host: h1}]\n")


# --- proxy_jump ------------------------------------------------------------------------------------

def test_jump_loops_of_any_length_reported_once(tmp_path: Path) -> None:
    text = HEAD + """    nodes:
      - {name: a, host: h1, proxy_jump: b}
      - {name: b, host: h2, proxy_jump: c}
      - {name: c, host: h3, proxy_jump: a}
      - {name: d, host: h4, proxy_jump: d}
      - {name: e, host: h5, proxy_jump: a}
  q:
    nodes:
      - {name: f, host: h6, proxy_jump: g}
      - {name: g, host: h7, proxy_jump: f}
"""
    assert problems(tmp_path, text) == [
        "providers.p.nodes[0].proxy_jump: proxy_jump loop a -> b -> c -> a: none of these nodes "
        "can be reached",
        "providers.p.nodes[3].proxy_jump: node 'd' jumps through itself",
        "providers.q.nodes[0].proxy_jump: proxy_jump loop f -> g -> f: none of these nodes can be "
        "reached",
    ]


def test_jump_loop_through_provider_access(tmp_path: Path) -> None:
    text = HEAD + "    access: {proxy_jump: gw}\n    nodes:\n      - {name: gw, host: h0}\n" \
                  "      - {name: n1, host: h1}\n"
    assert problems(tmp_path, text) == ["providers.p.access.proxy_jump: node 'gw' jumps through itself"]


def test_chains_ending_at_a_jump_host_are_fine(tmp_path: Path) -> None:
    text = "jump_hosts:\n  bastion: {host: 198.51.100.2}\n" + HEAD + """    nodes:
      - {name: a, host: h1, proxy_jump: bastion}
      - {name: b, host: h2, proxy_jump: a}
"""
    assert [n.proxy_jump for n in load(tmp_path, text).nodes] == ["bastion", "a"]


def test_a_node_named_like_a_jump_host_is_ambiguous(tmp_path: Path) -> None:
    text = "jump_hosts:\n  gw: {host: 198.51.100.2}\n" + HEAD + \
        "    nodes:\n      - {name: gw, host: h1}\n      - {name: n, host: h2, proxy_jump: gw}\n"
    got = problems(tmp_path, text)
    assert got == ["providers.p.nodes[0].name: node 'gw' has the name of a jump host (line 2): "
                   "proxy_jump would be ambiguous; rename one"]


# --- files the inventory names -----------------------------------------------------------------------

def test_ssh_config_must_exist(tmp_path: Path) -> None:
    text = "settings: {ssh_config: /nonexistent/gpuvet/ssh_config}\n" + node_with("port", "22")
    assert problems(tmp_path, text) == ["settings.ssh_config: /nonexistent/gpuvet/ssh_config does "
                                        "not exist"]
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host *\n")
    load(tmp_path, f"settings: {{ssh_config: {cfg}}}\n" + node_with("port", "22"))


def test_known_hosts_file_or_its_directory_must_exist(tmp_path: Path) -> None:
    ssh = node_with("port", "22")
    missing_dir = "settings: {known_hosts: /nonexistent/gpuvet/known_hosts}\n"
    assert problems(tmp_path, missing_dir + ssh)[0].startswith(
        "settings.known_hosts: neither /nonexistent/gpuvet/known_hosts nor its directory "
        "/nonexistent/gpuvet exists")
    load(tmp_path, f"settings: {{known_hosts: {tmp_path}/new_known_hosts}}\n" + ssh)
    assert problems(tmp_path, f"settings: {{known_hosts: {tmp_path}}}\n" + ssh) == [
        f"settings.known_hosts: {tmp_path} is a directory; name the known_hosts file"]


def test_default_known_hosts_may_be_missing_on_a_fresh_machine(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "fresh-home"))  # no ~/.ssh at all
    load(tmp_path, node_with("port", "22"))
    load(tmp_path, "settings: {known_hosts: ~/.ssh/known_hosts}\n" + node_with("port", "22"))


def test_files_checked_only_for_providers_that_use_ssh(tmp_path: Path) -> None:
    text = ("settings: {ssh_config: /nonexistent/a, known_hosts: /nonexistent/b/known_hosts}\n"
            "providers:\n  sim:\n    executor: local\n"
            "    nodes: [{name: s1, identity_file: /nonexistent/key}]\n")
    assert [n.name for n in load(tmp_path, text).nodes] == ["s1"]
    ssh = text.replace("executor: local", "executor: ssh").replace("name: s1,", "name: s1, host: h,")
    assert [p.split(":")[0] for p in problems(tmp_path, ssh)] == [
        "settings.ssh_config", "settings.known_hosts", "providers.sim.nodes[0].identity_file"]


def test_identity_files_of_nodes_and_jump_hosts(tmp_path: Path) -> None:
    key = tmp_path / "id"
    key.write_text("not really a key\n")
    text = (f"jump_hosts:\n  j: {{host: h, identity_file: {tmp_path}}}\n" + HEAD +
            f"    access: {{identity_file: {key}}}\n"
            "    nodes: [{name: n, host: h1, identity_file: ~/nonexistent-key-gpuvet}]\n")
    assert problems(tmp_path, text) == [
        f"jump_hosts.j.identity_file: {tmp_path} is a directory, not a file",
        "providers.p.nodes[0].identity_file: ~/nonexistent-key-gpuvet does not exist"]


# --- wrong shapes --------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, where", [
    ("providers: [p]\n", "providers"),
    ("settings: 5\n" + node_with("port", "22"), "settings"),
    ("jump_hosts: [j]\n" + node_with("port", "22"), "jump_hosts"),
    (HEAD + "    access: [user]\n    nodes: [{name: n, host: h}]\n", "providers.p.access"),
    (HEAD + "    nodes: {name: n, host: h}\n", "providers.p.nodes"),
    (HEAD + "    nodes: [n1]\n", "providers.p.nodes[0]"),
    (node_with("env", "[A, B]"), "providers.p.nodes[0].env"),
    (HEAD + "    executor: [ssh]\n    nodes: [{name: n, host: h}]\n", "providers.p.executor"),
    ("providers:\n  p: [x]\n", "providers.p"),
])
def test_a_mapping_or_list_where_the_other_is_meant(tmp_path: Path, text: str, where: str) -> None:
    got = problems(tmp_path, text)
    assert got and got[0].startswith(where + ": "), got
