"""The nccl step's network mode: the environment it runs with, the transport NCCL chose,
GPUDirect RDMA and busbw per NIC judged against the order's fabric, from real NCCL INFO
logs (published ones in tests/fixtures/public, our own captures of simulated nodes)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from orchestrator import inventory, nccltests
from orchestrator.errors import UsageError
from orchestrator.inventory import Fabric, Inventory
from orchestrator.nccltests import BuildDoc
from orchestrator.parsers.nccl_debug import parse_nccl_debug
from orchestrator.steps.nccl import network, torchbench
from orchestrator.steps.nccl import step as nccl_step
from orchestrator.steps.nccl.judge import Series, judge_series
from orchestrator.steps.nccl.network import NetResult, judge_network
from orchestrator.store import Run
from orchestrator.suite import NcclParams, Suite, load_suite

FIX = Path(__file__).resolve().parents[1] / "fixtures"
PUB = FIX / "public"
# NVIDIA/nccl issue 707: one node, 4 x A100, NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, every
# channel NET/IB/<dev>/GDRDMA
GDR_ONE_NODE = PUB / "nccl-info_p2p-shm-off_4x-a100_ib-gdrdma_nccl-707.log"
# Mellanox/nv_peer_memory issue 56: two nodes, NET/IB/0 without GDRDMA, and NCCL's
# `GPU Direct RDMA Disabled for GPU 2[2] / HCA 0 (distance 3 >= 2)`
NO_GDR_TWO_NODES = PUB / "nccl-info_2node_ib-no-gdrdma-distance_nv-peer-memory-56.log"
# NVIDIA/nccl issue 1537: RoCE, `GPU Direct RDMA Disabled for HCA 0 'mlx5_0'`, no channels
GDR_DISABLED_HCA = PUB / "nccl-info_gdr-disabled-for-hca_roce_nccl-1537.log"
# our own: two simulated nodes sharing one host, NCCL over NET/Socket (H200, H100)
SOCKET_H200 = [FIX / "h200x2-gpuvet" / f"multi_sim2node_socket_round{r}.log" for r in (1, 2, 3)]
SUITE = Suite()


def results(path: Path, fabric: Fabric, busbw: float | None = None,
            ranks_per_node: int | None = None) -> dict[str, NetResult]:
    dbg = parse_nccl_debug(path.read_text(), source=path.name)
    return {r.code: r for r in judge_network(dbg, fabric, busbw=busbw, size="8 GiB",
                                             ranks_per_node=ranks_per_node)}


# --- the environment -------------------------------------------------------------------

def test_the_network_mode_turns_peer_access_and_shared_memory_off() -> None:
    normal = nccltests.run_env(NcclParams())
    assert normal == nccltests.RUN_ENV  # the normal mode is as it was
    one = nccltests.run_env(NcclParams(), mode="network")
    assert one == {**nccltests.RUN_ENV, "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1",
                   "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    across = nccltests.run_env(NcclParams(), mode="network", multi=True)
    assert across == {**one, "NCCL_ALGO": "Ring"}
    assert "NCCL_ALGO" not in nccltests.run_env(NcclParams(), multi=True)


def test_the_step_runs_each_mode_with_its_environment_and_log_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The step's command builder, unit-level: which rounds run, under which env and name."""
    inv = _inv(tmp_path, "{type: ib, nics: 8, rate_gbps: 400}", nodes=2)
    run = _run(tmp_path)
    built = BuildDoc(ok=True, gpus=8, mpi=True, binary="/b/all_reduce_perf", flags=[])
    monkeypatch.setattr(nccl_step, "_build_node", lambda ex, run, suite, archive: built)
    seen: list[tuple[str, dict[str, str] | None, str]] = []

    def rounds(ex: object, run: Run, suite: Suite, out_dir: Path, label: str, command: object,
               env: dict[str, str] | None = None) -> list[tuple[int, Path, bool]]:
        cmd, _ = command(1)  # type: ignore[operator]
        seen.append((label, env, str(cmd)))
        return []

    monkeypatch.setattr(nccl_step, "_rounds", rounds)
    suite = Suite(nccl=NcclParams(modes=("normal", "network"), collectives=("all_reduce",
                                                                             "alltoall")))
    nccl_step.run_nccl(inv, inv.nodes, run, suite)
    labels = {label: env for label, env, _ in seen}
    assert sorted(labels) == sorted(["single", "single_alltoall", "single_network",
                                     "single_network_alltoall", "multi", "multi_alltoall",
                                     "multi_network", "multi_network_alltoall"])
    assert labels["single"] == nccltests.RUN_ENV
    assert labels["multi"] == nccltests.RUN_ENV
    for label in ("single_network", "single_network_alltoall"):
        assert labels[label] == nccltests.run_env(NcclParams(), mode="network")
    for label in ("multi_network", "multi_network_alltoall"):
        assert labels[label] == nccltests.run_env(NcclParams(), mode="network", multi=True)
    cmds = {label: cmd for label, _, cmd in seen}
    assert "alltoall_perf" in cmds["single_network_alltoall"]
    assert "-g 8" in cmds["single_network"]


# --- the suite and the inventory ----------------------------------------------------------

def test_the_mode_enters_the_suite_hash_only_when_it_is_asked_for() -> None:
    assert Suite(nccl=NcclParams(modes=("normal",))).hash == Suite().hash == "719fcba1d20e5499"
    both = Suite(nccl=NcclParams(modes=("normal", "network"))).hash
    alone = Suite(nccl=NcclParams(modes=("network",))).hash
    assert len({Suite().hash, both, alone}) == 3


@pytest.mark.parametrize(("value", "says"), [
    ("[]", "at least one mode"),
    ("[network, network]", "network named more than once"),
    ("[netwrok]", "nccl.modes.0"),
])
def test_a_wrong_modes_list_is_refused_with_its_place(tmp_path: Path, value: str,
                                                      says: str) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(f"nccl:\n  modes: {value}\n")
    with pytest.raises(UsageError, match=says):
        load_suite(p)


def test_gpudirect_is_checked_by_inventory_check(tmp_path: Path) -> None:
    assert _inv(tmp_path, "{type: ib, gpudirect: true}").providers["lab"].expect.fabric.gpudirect
    with pytest.raises(inventory.InventoryError, match="needs an RDMA fabric"):
        _inv(tmp_path, "{type: ethernet, gpudirect: true}")
    with pytest.raises(inventory.InventoryError, match="valid boolean"):
        _inv(tmp_path, "{type: ib, gpudirect: maybe}")


# --- the parser on published logs --------------------------------------------------------

def test_gdrdma_and_the_gdr_disabled_lines_are_read_from_published_logs() -> None:
    on = parse_nccl_debug(GDR_ONE_NODE.read_text())
    assert on.used == ["NET/IB"] and on.gdrdma and not on.gdr_notes
    assert network.nics_used(on.connections) == {"10-90-43-152": ["0", "2", "4", "5"]}
    off = parse_nccl_debug(NO_GDR_TWO_NODES.read_text())
    assert off.used == ["NET/IB", "P2P"] and not off.gdrdma
    assert [(g.line_no, g.enabled, g.what) for g in off.gdr_notes][:2] == [
        (3, False, "GPU 2[2] / HCA 0 (distance 3 >= 2)"),
        (9, False, "GPU 2[2] / HCA 0 (distance 3 >= 2)")]
    hca = parse_nccl_debug(GDR_DISABLED_HCA.read_text())
    assert [(g.host, g.what) for g in hca.gdr_notes] == [
        ("hostname1", "HCA 0 'mlx5_0'"), ("hostname1", "HCA 1 'mlx5_1'")]


# --- GPUDirect RDMA -----------------------------------------------------------------------

def test_gdrdma_on_every_channel_passes_where_it_was_ordered() -> None:
    got = results(GDR_ONE_NODE, Fabric(type="ib", gpudirect=True))
    assert got["NCCL_GPUDIRECT"].severity == "PASS"
    assert "every NET channel (12, GDRDMA)" in got["NCCL_GPUDIRECT"].message
    assert got["NCCL_NET_TRANSPORT"].details["transports"] == ["NET/IB"]
    # unordered it is a fact, not a verdict
    assert results(GDR_ONE_NODE, Fabric(type="ib"))["NCCL_GPUDIRECT"].severity == "INFO"


def test_no_gdrdma_fails_where_it_was_ordered_and_names_the_causes() -> None:
    got = results(NO_GDR_TWO_NODES, Fabric(type="ib", gpudirect=True))
    gdr = got["NCCL_GPUDIRECT"]
    assert gdr.severity == "FAIL"
    for cause in ("nvidia_peermem", "DMA-BUF", "ACS", "IOMMU"):
        assert cause in gdr.message
    # NCCL's own reason is quoted with its line
    assert "GPU Direct RDMA Disabled for GPU 2[2] / HCA 0 (distance 3 >= 2) (line 3" in gdr.message
    assert "none of the 4 NET channel(s)" in gdr.message
    # the log shows P2P/IPC between local GPUs: not the network alone
    assert got["NCCL_NETWORK_NOT_ISOLATED"].severity == "WARN"
    info = results(NO_GDR_TWO_NODES, Fabric(type="ib"))["NCCL_GPUDIRECT"]
    assert info.severity == "INFO" and "likely causes" not in info.message.lower()


def test_some_channels_without_gdrdma_are_named(tmp_path: Path) -> None:
    """A log where one NIC's channels lack GDRDMA: the line is named (a planted drop of
    the per-channel check would call this GPUDirect on every channel)."""
    text = GDR_ONE_NODE.read_text().replace("via NET/IB/0/GDRDMA", "via NET/IB/0")
    p = tmp_path / "mixed.log"
    p.write_text(text)
    got = results(p, Fabric(type="ib", gpudirect=True))["NCCL_GPUDIRECT"]
    assert got.severity == "FAIL" and "on 2 of 12 NET channel(s)" in got.message
    assert got.details["lines"] == [7, 9]


# --- sockets --------------------------------------------------------------------------------

def test_sockets_where_rdma_was_ordered_fail_and_the_line_rate_judge_does_not_apply() -> None:
    got = results(SOCKET_H200[0], Fabric(type="ib", nics=8, rate_gbps=400), busbw=2.8,
                  ranks_per_node=1)
    assert got["NCCL_SOCKET_FALLBACK"].severity == "FAIL"
    sock = got["NCCL_NET_SOCKET"]
    assert sock.severity == "INFO" and "per-NIC line-rate judge" in sock.message
    assert "NCCL_NET_PER_NIC" not in got and "NCCL_GPUDIRECT" not in got


def test_sockets_on_a_host_without_rdma_are_a_fact() -> None:
    got = results(SOCKET_H200[0], Fabric(), busbw=2.8, ranks_per_node=1)
    assert set(got) == {"NCCL_NET_TRANSPORT", "NCCL_NET_SOCKET"}
    assert got["NCCL_NET_TRANSPORT"].details["transports"] == ["NET/Socket"]


# --- busbw per NIC --------------------------------------------------------------------------

def test_per_nic_is_every_ranks_busbw_spread_over_the_nics_used() -> None:
    """Four ranks on one node each send at busbw through four NICs (NET/IB/0, 2, 4, 5):
    each NIC carries one rank's busbw. Dividing busbw by the NICs alone would read 5."""
    assert network.per_nic_gbs(20.0, 4, 4) == 20.0
    assert network.per_nic_gbs(20.0, 8, 4) == 40.0
    got = results(GDR_ONE_NODE, Fabric(type="ib", nics=4, rate_gbps=200), busbw=20.0,
                  ranks_per_node=4)["NCCL_NET_PER_NIC"]
    assert got.details["per_nic_gbs"] == 20.0 and got.details["nics"] == 4
    assert got.severity == "PASS" and "80% of the 200 Gb/s line rate (25 GB/s" in got.message


def test_a_slow_nic_rate_is_a_warning_with_its_figures() -> None:
    got = results(GDR_ONE_NODE, Fabric(type="ib", nics=4, rate_gbps=400), busbw=20.0,
                  ranks_per_node=4)["NCCL_NET_PER_NIC"]
    assert got.severity == "WARN" and "40% of the 400 Gb/s" in got.message
    assert got.details["fraction"] == pytest.approx(0.4)


def test_fewer_nics_used_than_ordered_is_named() -> None:
    got = results(GDR_ONE_NODE, Fabric(type="ib", nics=8, rate_gbps=200), busbw=20.0,
                  ranks_per_node=4)
    assert got["NCCL_NET_NICS"].severity == "WARN"
    assert got["NCCL_NET_NICS"].details == {"used": 4, "ordered": 8}
    assert got["NCCL_NET_PER_NIC"].details["nics"] == 4  # the NICs NCCL used


def test_no_rate_in_the_order_is_not_judged() -> None:
    got = results(GDR_ONE_NODE, Fabric(type="ib"), busbw=20.0, ranks_per_node=4)
    assert got["NCCL_NET_PER_NIC"].severity == "INFO"
    assert "no rate_gbps" in got["NCCL_NET_PER_NIC"].message


def test_without_nccl_info_nothing_is_judged() -> None:
    got = judge_network(None, Fabric(type="ib", gpudirect=True), busbw=10.0, size="1 GiB",
                        ranks_per_node=8)
    assert [(r.code, r.severity) for r in got] == [("NCCL_NETWORK_NOT_MEASURED", "INFO")]
    dbg = parse_nccl_debug(GDR_DISABLED_HCA.read_text())  # INFO lines but no channel
    got = judge_network(dbg, Fabric(type="roce", gpudirect=True), busbw=10.0, size="1 GiB",
                        ranks_per_node=8)
    assert [r.code for r in got] == ["NCCL_NETWORK_NOT_MEASURED"]


# --- through the step's judge ----------------------------------------------------------

def test_a_network_series_is_labelled_tagged_and_judged_against_the_fabric(
        tmp_path: Path) -> None:
    """Our own capture: two simulated H200 nodes over NET/Socket, judged as the network
    mode's multi-node series of a provider that ordered InfiniBand."""
    inv = _inv(tmp_path, "{type: ib, nics: 8, rate_gbps: 400, gpudirect: true}", nodes=2)
    run = _run(tmp_path)
    s = Series("multi", inv.nodes, [(r, p, False) for r, p in enumerate(SOCKET_H200, 1)],
               BuildDoc(), collective="all_reduce", mode="network")
    fs, ms = judge_series(s, run, inv, SUITE)
    codes = {f.code: f for f in fs}
    assert codes["NCCL_SOCKET_FALLBACK"].message.startswith("[multi network] ib was ordered")
    assert "per-NIC line-rate judge does not apply" in codes["NCCL_NET_SOCKET"].message
    assert "NCCL_REFERENCE" not in codes and "NCCL_REFERENCE_NONE" not in codes
    assert {m.tags.get("mode") for m in ms} == {"network"}
    assert [f for f in fs if f.code == "NCCL_SOCKET_FALLBACK"][0].evidence == \
        [str(SOCKET_H200[0])]


def test_the_normal_mode_keeps_its_labels_and_tags(tmp_path: Path) -> None:
    inv = _inv(tmp_path, "{type: ib}", nodes=2)
    s = Series("multi", inv.nodes, [(1, SOCKET_H200[0], False)], BuildDoc(),
               collective="all_reduce")
    fs, ms = judge_series(s, _run(tmp_path), inv, SUITE)
    assert all(f.message.startswith("[multi] ") for f in fs)
    assert all("mode" not in m.tags for m in ms)
    assert "NCCL_NET_TRANSPORT" not in {f.code for f in fs}


TORCH_NCCL = FIX / "h200x2-gpuvet" / "torch_multi_sim2node.log"  # backend nccl, NET/Socket


def test_the_torch_engine_on_nccl_is_judged_from_its_nccl_info(tmp_path: Path) -> None:
    inv = _inv(tmp_path, "{type: ib}", nodes=2)
    s = Series("multi", inv.nodes, [(1, TORCH_NCCL, False)], BuildDoc(), engine="torch",
               collective="all_reduce", mode="network")
    fs, _ = judge_series(s, _run(tmp_path), inv, SUITE)
    codes = {f.code: f for f in fs}
    assert codes["NCCL_SOCKET_FALLBACK"].message.startswith("[torch multi network] ")
    assert "NCCL_NETWORK_NOT_MEASURED" not in codes


def test_the_torch_engine_on_gloo_says_what_it_cannot_measure(tmp_path: Path) -> None:
    """The CPU path (gloo): the mode runs, its GPU-only parts are not measured, one line
    says why. The torch log is our capture with its backend line as gloo writes it."""
    log = tmp_path / "torch_multi_network.log"
    log.write_text(TORCH_NCCL.read_text().replace(", backend nccl", ", backend gloo"))
    inv = _inv(tmp_path, "{type: ib, gpudirect: true}", nodes=2)
    s = Series("multi", inv.nodes, [(1, log, False)], BuildDoc(), engine="torch",
               collective="all_reduce", mode="network")
    fs, ms = judge_series(s, _run(tmp_path), inv, SUITE)
    nm = [f for f in fs if f.code == "NCCL_NETWORK_NOT_MEASURED"]
    assert len(nm) == 1 and nm[0].message.startswith("[torch multi network] ")
    assert "ran on gloo" in nm[0].message and nm[0].details["backend"] == "gloo"
    assert not [f for f in fs if f.severity == "FAIL"]
    assert ms and {m.tags["mode"] for m in ms} == {"network"}  # its busbw is still kept


# --- helpers ----------------------------------------------------------------------------------

def _inv(tmp_path: Path, fabric: str, nodes: int = 1) -> Inventory:
    names = "\n".join(f"      - {{name: n{i}, work_dir: {tmp_path / f'w{i}'}, "
                      f"python: {sys.executable}}}" for i in range(nodes))
    p = tmp_path / f"inv{abs(hash(fabric))}-{nodes}.yaml"
    p.write_text(f"version: 1\nproviders:\n  lab:\n    executor: local\n    expect:\n"
                 f"      fabric: {fabric}\n    nodes:\n{names}\n")
    return inventory.load(p)


def _run(tmp_path: Path) -> Run:
    return Run.create(tmp_path / "results", command="test", suite_hash=SUITE.hash,
                      suite=SUITE.model_dump(mode="json"), inventory_path=None)


# --- compare and regress keep the network mode apart ---------------------------------------

def test_compare_and_regress_keep_the_network_modes_busbw_apart(tmp_path: Path) -> None:
    """The same all_reduce measured through the NICs alone (mode tag) is a series of its
    own: mixed with the normal mode's, its 40 GB/s would drag the NVLink figure down."""
    from datetime import timedelta

    import numpy as np

    from orchestrator.analysis import compare, regress
    from orchestrator.records import Measurement
    from tests.bench import regress_bench

    root = tmp_path / "results"
    rng = np.random.default_rng(3)
    for i in range(3):
        run_id = (regress_bench.T0 + timedelta(hours=6 * i)).strftime("%Y%m%d-%H%M%S") + \
            f"-{i:04x}"
        net = [Measurement(run_id=run_id, provider="lab", nodes=["n1"], step="nccl",
                           metric="busbw", value=float(40 * rng.normal(1, 0.01)), unit="GB/s",
                           suite_hash=regress_bench.SUITE_HASH, scope="single",
                           engine="nccl-tests", size=size, inplace=False, round=r,
                           tags={"op": "all_reduce", "mode": "network"})
               for size in regress_bench.SIZES for r in (1, 2, 3)]
        ar = regress_bench.busbw_values(rng, ["n1"], 3, 300.0, 0.01)
        assert regress_bench.write_run(root, i, "lab", ar, extra=net) == run_id
    c = compare.build(root, ["lab"], with_cost=False)
    blocks = {t.title: t for t in c.tables if t.title.startswith("busbw (")}
    assert list(blocks) == ["busbw (all_reduce, out-of-place)",
                            "busbw (all_reduce network, out-of-place)"]
    assert all(r[2] == pytest.approx(300, rel=0.03)
               for r in blocks["busbw (all_reduce, out-of-place)"].rows)
    assert all(r[2] == pytest.approx(40, rel=0.03)
               for r in blocks["busbw (all_reduce network, out-of-place)"].rows)
    keys = {r.key.collective for r in regress.evaluate(root).rows if not r.is_node}
    assert keys == {"", "all_reduce network"}


def test_the_network_flag_adds_the_mode_to_the_suite(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.unit.clirun import gpuvet

    seen: list[Suite] = []
    monkeypatch.setattr(nccl_step, "run_nccl",
                        lambda inv, nodes, run, suite, **kw: seen.append(suite))
    inv_path = tmp_path / "inv.yaml"
    inv_path.write_text(f"version: 1\nproviders:\n  lab:\n    executor: local\n    nodes:\n"
                        f"      - {{name: n0, work_dir: {tmp_path / 'w'}}}\n")
    res = gpuvet(capsys, "nccl", "-i", inv_path, "--results", tmp_path / "r", "--network")
    assert res.returncode == 0, res.output
    assert seen[0].nccl.modes == ("normal", "network")
    assert seen[0].hash != Suite().hash


def test_the_torch_engine_runs_the_network_mode_with_its_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nccl-tests without MPI: the multi-node network series is the torch benchmark's, its
    ranks started with the network mode's environment (Ring across nodes), its log judged."""
    from orchestrator.executors.base import CommandResult

    inv = _inv(tmp_path, "{type: ib}", nodes=2)
    run = _run(tmp_path)
    built = BuildDoc(ok=True, gpus=1, mpi=False, binary="/x/all_reduce_perf")
    monkeypatch.setattr(nccl_step, "_build_node", lambda ex, run, suite, archive: built)
    envs: list[dict[str, str]] = []

    def fake_run(ex: object, args: list[str], *, env: dict[str, str],
                 stdout_path: Path | None = None, **kw: object) -> CommandResult:
        envs.append(env)
        if stdout_path is not None:
            stdout_path.write_text(TORCH_NCCL.read_text())
        return CommandResult(node="n", command="x", rc=0, stdout="", stderr="", duration_s=0)

    monkeypatch.setattr(torchbench.payload_mod, "run", fake_run)
    suite = Suite(nccl=NcclParams(modes=("network",)))
    nccl_step.run_nccl(inv, inv.nodes, run, suite, single=False)
    # the network mode's environment, and the rendezvous of ranks started without torchrun
    want = nccltests.run_env(NcclParams(), mode="network", multi=True)
    assert [{k: v for k, v in e.items() if k in want} for e in envs] == [want] * 2
    assert sorted(e["RANK"] for e in envs) == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"}
    fs = run.findings()
    assert "[torch multi network] ib was ordered" in next(
        f.message for f in fs if f.code == "NCCL_SOCKET_FALLBACK")
    assert [p.name for p in run.provider_dir("lab", "nccl").glob("torch_*.log")] == [
        "torch_multi_network.log"]
