"""NCCL_DEBUG=INFO extraction from real H200 logs and multi-node samples."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers import parse
from orchestrator.parsers.nccl_debug import NcclDebugFacts, parse_nccl_debug

FIX = Path(__file__).resolve().parents[2] / "fixtures"
REAL = FIX / "h200x2" / "nccl-tests"
SAMPLES = FIX / "nccl-tests"


def _parse(path: Path) -> NcclDebugFacts:
    return parse_nccl_debug(path.read_text(), source=str(path))


def test_real_single_node_uses_p2p() -> None:
    f = _parse(REAL / "all_reduce_1G-4G_g2_nccl-debug-info.log")
    assert f.nccl_version == "2.28.9" and f.nccl_cuda == "13.0"
    assert f.n_ranks == 2 and f.n_nodes == 1 and f.hosts == ["vm"]
    assert f.transports == ["P2P"] and not f.gdrdma
    assert len(f.connections) == 48  # 24 channels each way
    c = f.connections[0]
    assert (c.line_no, c.channel, c.from_rank, c.to_rank, c.transport, c.detail) == (
        88, 0, 0, 1, "P2P", "direct pointer")
    assert {(c.from_rank, c.to_rank) for c in f.connections} == {(0, 1), (1, 0)}
    assert f.networks == ["Socket"]  # NET is set up for bootstrap even on one node
    assert any(i.kind == "Socket" and i.name == "eth0" and i.address == "192.0.2.2<0>"
               for i in f.interfaces)
    assert "Failed to initialize NET plugin IB" in f.plugin_lines
    assert f.warnings == []


def test_real_simulated_two_nodes_use_socket() -> None:
    f = _parse(REAL / "all_reduce_mpi_np2_simulated-2node-socket.log")
    assert f.n_nodes == 2 and f.n_ranks == 2
    assert [(c.rank, c.local_ranks) for c in f.comms] == [(0, 1), (1, 1)]
    assert f.transports == ["NET"] and f.networks == ["Socket"]
    assert len(f.connections) == 8
    assert {c.net for c in f.connections} == {"Socket"}
    assert {c.direction for c in f.connections} == {"send", "receive"}
    assert all(c.detail == "Socket/0" and not c.gdrdma for c in f.connections)


def test_real_logs_without_info_raise() -> None:
    path = REAL / "all_reduce_8B-128M_g2_round1.log"
    with pytest.raises(ParseError) as exc:
        parse("nccl-debug", path.read_text(), source=str(path))
    assert "NCCL_DEBUG=INFO" in str(exc.value)
    with pytest.raises(ParseError):
        parse_nccl_debug("")


def test_ib_gdrdma_two_nodes() -> None:
    f = _parse(SAMPLES / "all_reduce_2node-h100_ib-gdrdma_nccl-info.log")
    assert f.nccl_version == "2.21.5" and f.n_ranks == 16 and f.n_nodes == 2
    assert f.hosts == ["gpu-node-017", "gpu-node-018"]
    assert f.transports == ["P2P", "NET"] and f.networks == ["IB"] and f.gdrdma
    ib = [i for i in f.interfaces if i.kind == "IB"]
    assert [i.name for i in ib if i.host == "gpu-node-017"] == [
        "mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]
    assert ib[0].address == "1/IB"
    net = [c for c in f.connections if c.transport == "NET"]
    assert net and all(c.net == "IB" and c.gdrdma for c in net)
    assert {c.detail for c in f.connections if c.transport == "P2P"} == {"CUMEM/read"}
    shared = [c for c in net if c.detail.endswith("/Shared")]
    assert len(shared) == 4 and shared[0].detail == "IB/0/GDRDMA/Shared"


def test_socket_fallback_with_warning() -> None:
    f = _parse(SAMPLES / "all_reduce_2node-a100_socket-fallback_nccl-info.log")
    assert f.n_nodes == 2 and f.transports == ["NET"] and f.networks == ["Socket"]
    assert not f.gdrdma
    assert [(w.line_no, w.kind) for w in f.warnings] == [(33, "nccl-warn")]
    assert "socketStartConnect" in f.warnings[0].text


def test_aws_ofi_efa() -> None:
    f = _parse(SAMPLES / "all_reduce_2node-p4d_aws-ofi-efa_nccl-info.log")
    assert f.networks == ["AWS Libfabric"] and f.n_nodes == 2 and f.n_ranks == 16
    net = [c for c in f.connections if c.transport == "NET"]
    assert {c.net for c in net} == {"AWS Libfabric"} and all(c.gdrdma for c in net)
    assert any(c.detail == "IPC/read" for c in f.connections if c.transport == "P2P")
    assert any("Selected Provider is efa" in p for p in f.plugin_lines)


def test_crash_warnings_have_line_numbers() -> None:
    f = _parse(SAMPLES / "all_reduce_2node-h100_crash-truncated.log")
    assert [w.line_no for w in f.warnings] == [36]
    assert "IBV_WC_RETRY_EXC_ERR" in f.warnings[0].text


def test_old_ring_lines_shm_ibext_collnet() -> None:
    text = "\n".join([
        "n1:9100:9147 [0] NCCL INFO NCCL version 2.4.8+cuda10.1",
        "n1:9100:9147 [0] NCCL INFO Ring 00 : 1[18100000] -> 0[435e00000] [receive] "
        "via NET/IB/0/GDRDMA",
        "n1:9100:9147 [0] NCCL INFO Ring 00 : 0[435e00000] -> 1[18100000] [send] via NET/IB/0",
        "n1:9100:9148 [1] NCCL INFO Channel 01 : 2[2] -> 3[3] via SHM/direct/direct",
        "n1:9100:9148 [1] NCCL INFO Channel 02/0 : 2[2] -> 10[2] [send] via NET/IBext/0/GDRDMA",
        "n1:9100:9148 [1] NCCL INFO Channel 03/0 : 2[2] -> 10[2] [send] via COLLNET/IBext/1",
        "n1:9100:9148 [1] NCCL INFO Using network IBext_v8",
        "n1:9100:9148 [1] NCCL INFO comm 0x1 rank 2 nranks 16 cudaDev 2 busId 3f000 - Init COMPLETE",
        "unrelated line",
    ])
    f = parse_nccl_debug(text)
    assert f.nccl_version == "2.4.8" and f.nccl_cuda == "10.1"
    assert f.n_ranks == 16 and f.n_nodes is None
    assert f.transports == ["SHM", "NET", "COLLNET"]
    assert [(c.from_rank, c.to_rank, c.gdrdma) for c in f.connections[:2]] == [
        (1, 0, True), (0, 1, False)]
    assert [c.net for c in f.connections[3:]] == ["IBext", "IBext"]
    assert f.networks == ["IBext_v8"]


# ----------------------------------------------------------------- several communicators


def test_every_communicator_is_reported() -> None:
    """A log with two jobs' inits: before, only the first communicator was reported."""
    text = ((REAL / "all_reduce_1G-4G_g2_nccl-debug-info.log").read_text()
            + (REAL / "all_reduce_mpi_np2_simulated-2node-socket.log").read_text())
    f = parse_nccl_debug(text)
    assert [(c.comm_id, c.n_ranks, c.n_nodes, c.ranks) for c in f.communicators] == [
        ("0xf4e9aabd801644", 2, 1, [0, 1]), ("0x2afe7141fbbce8c7", 2, 2, [0, 1])]
    assert len(f.comms) == 4 and {c.comm_id for c in f.comms} == {
        "0xf4e9aabd801644", "0x2afe7141fbbce8c7"}


def test_versions_per_host_and_mismatch() -> None:
    f = _parse(REAL / "all_reduce_mpi_np2_simulated-2node-socket.log")
    assert [(v.host, v.pid, v.version, v.cuda) for v in f.versions] == [
        ("vm", 3465, "2.28.9", "13.0"), ("vm", 3466, "2.28.9", "13.0")]
    assert f.versions_by_host == {"vm": ["2.28.9"]} and not f.version_mismatch
    # the second process on another host with another NCCL: both are reported
    text = (REAL / "all_reduce_mpi_np2_simulated-2node-socket.log").read_text().replace(
        "vm:3466:3466 [1] NCCL INFO NCCL version 2.28.9+cuda13.0",
        "vm2:3466:3466 [1] NCCL INFO NCCL version 2.27.7+cuda12.9")
    g = parse_nccl_debug(text)
    assert g.nccl_version == "2.28.9"  # the first, as before
    assert g.versions_by_host == {"vm": ["2.28.9"], "vm2": ["2.27.7"]} and g.version_mismatch


def test_communicators_without_comm_id() -> None:
    f = _parse(SAMPLES / "all_reduce_2node-a100_socket-fallback_nccl-info.log")
    assert [(c.comm_id, c.n_ranks, c.n_nodes, c.hosts) for c in f.communicators] == [
        (None, 2, 2, ["a100-vm-1", "a100-vm-2"])]


def test_srun_labelled_info_lines() -> None:
    text = "".join(f" 0: {ln}\n" for ln in
                   (REAL / "all_reduce_1G-4G_g2_nccl-debug-info.log").read_text().splitlines())
    f = parse_nccl_debug(text)
    assert f.nccl_version == "2.28.9" and f.transports == ["P2P"] and len(f.communicators) == 1
