"""The README's quick start, as written, on two real sshd nodes.

The commands are read from the README's "Quick start" block and run one by one
with bash in a folder laid out like a clone (the example inventory under
`inventories/`), gpuvet being the development venv's (the install line itself is
tests/integration/test_install.py's). The one edit the README asks for is made
between `cp` and `inventory check`: the two `host:` values become the nodes'
addresses; `expect` stays the example's order (8 x A100, which the GPU-less
nodes do not have: FAILs and NO-GO are the expected answer).

The user's side is set up as the README assumes: `ssh HOST` works without a
password (a ~/.ssh/config naming the user and key, in a HOME of the test's own),
no known_hosts yet (`ping --accept-new-host-keys` records the keys). The two
nodes are two machines: each gets a /tmp of its own (the example's work_dir is
/tmp/gpuvet), as two rented hosts have.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "inventories/example-two-providers.yaml"


def quick_start() -> list[str]:
    """The command lines of the README's quick start block, as written."""
    text = (ROOT / "README.md").read_text()
    m = re.search(r"^## Quick start.*?^```sh\n(.*?)^```", text, re.S | re.M)
    assert m, "the README has a quick start block"
    return [line for line in m.group(1).splitlines() if line.strip()]


@pytest.fixture()
def two_nodes(cluster_prerequisites: None) -> Iterator[Cluster]:
    c = Cluster.start(2)
    try:
        for node in c.nodes:  # a /tmp of its own: two machines, not one filesystem
            tmp = c.base / "nodes" / node.name / "tmp"
            tmp.mkdir(mode=0o1777)
            tmp.chmod(0o1777)
            res = c.netns_exec(node.name, ["mount", "--bind", str(tmp), "/tmp"])
            assert res.returncode == 0, res.stderr
        yield c
    finally:
        c.stop()


def test_the_readme_quick_start_runs_as_written(two_nodes: Cluster, tmp_path: Path) -> None:
    lines = quick_start()
    install = [ln for ln in lines if not re.match(r"(cp|gpuvet) ", ln)]
    assert [ln.split()[0] for ln in install] == ["python3", "source"]  # the venv: not here
    steps = [ln for ln in lines if ln not in install]
    assert [ln.split()[:2] for ln in steps] == [
        ["cp", EXAMPLE], ["gpuvet", "inventory"], ["gpuvet", "ping"], ["gpuvet", "pipeline"],
        ["gpuvet", "compare"], ["gpuvet", "report"]]
    assert "--accept-new-host-keys" in steps[2]

    clone = tmp_path / "clone"
    (clone / "inventories").mkdir(parents=True)
    shutil.copy(ROOT / EXAMPLE, clone / EXAMPLE)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    net = two_nodes.subnet.rsplit(".", 1)[0]
    (home / ".ssh" / "config").write_text(
        f"Host {net}.*\n  User {two_nodes.user}\n  IdentityFile {two_nodes.client_key}\n")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GPUVET_")},
           "HOME": str(home), "COLUMNS": "250",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}

    def run(line: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", line], cwd=clone, env=env, capture_output=True,
                              text=True, timeout=600)

    res = run(steps[0])  # cp
    assert res.returncode == 0, res.stderr
    mine = clone / steps[0].split()[2]
    text = mine.read_text()
    hosts = re.findall(r"^(\s+host:) (\S+)$", text, re.M)
    assert len(hosts) == len(two_nodes.nodes) == 2, hosts  # "the two `host:` values"
    for (key, old), node in zip(hosts, two_nodes.nodes, strict=True):
        text = text.replace(f"{key} {old}\n", f"{key} {node.ip}\n", 1)
    mine.write_text(text)

    outcome = {}
    for line in steps[1:]:
        res = run(line)
        outcome[line.split()[1]] = res
        assert "Traceback" not in res.stderr and "internal error" not in res.stderr, res.stderr
    check, ping = outcome["inventory"], outcome["ping"]
    assert check.returncode == 0, check.stdout + check.stderr
    assert ping.returncode == 0, ping.stdout + ping.stderr
    assert ping.stdout.count("accepted-new") == 2, ping.stdout
    known = (home / ".ssh" / "known_hosts").read_text()
    assert all(n.ip in known for n in two_nodes.nodes)
    # no GPU, no NVIDIA driver on the test nodes: the pipeline's answer is FAIL (exit 1)
    pipe = outcome["pipeline"]
    assert pipe.returncode == 1, pipe.stdout[-3000:] + pipe.stderr[-3000:]
    assert "NVIDIA_DRIVER_MISSING" in pipe.stdout and "pipeline verdict: FAIL" in pipe.stdout
    cmp_ = outcome["compare"]
    assert cmp_.returncode == 1, cmp_.stdout + cmp_.stderr  # a NO-GO provider
    assert "alpha-cloud" in cmp_.stdout and "beta-gpu" in cmp_.stdout
    rep = outcome["report"]
    assert rep.returncode == 0, rep.stdout + rep.stderr
    assert (clone / "report.html").is_file() and (clone / "report.md").is_file()
    assert "alpha-cloud: NO-GO" in rep.stderr and "beta-gpu: NO-GO" in rep.stderr
