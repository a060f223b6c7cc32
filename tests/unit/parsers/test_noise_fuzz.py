"""Known noise inserted anywhere leaves the facts unchanged, and every inserted line is listed.

Launchers, ssh, the shell and a person's editing put lines into what people
save. Here lines of each kind of known noise (as real logs show them) go into
clean captures at random places; the facts read must be those of the clean
capture, line numbers aside, and each inserted line must appear in
`ignored_lines`. An elision also counts as an edit (a person cut lines there).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from orchestrator.parsers.nccl_debug import parse_nccl_debug
from orchestrator.parsers.nccl_tests import parse_nccl_tests
from orchestrator.parsers.nvidia_smi_q import parse_nvidia_smi_q
from orchestrator.parsers.nvidia_smi_table import parse_nvidia_smi_table

FIX = Path(__file__).resolve().parents[2] / "fixtures"
FUZZ = settings(max_examples=int(os.environ.get("GPUVET_FUZZ_EXAMPLES", "40")), deadline=None,
                database=None, derandomize=not os.environ.get("GPUVET_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Each unit is inserted whole: an Open MPI banner block is its two rules and the text between.
NOISE: list[list[str]] = [
    ["[gpu-node-018:52006] 8 more processes have sent help message help-mtl-ofi.txt / OFI call "
     "fail"],
    ['[gpu-node-018:52006] Set MCA parameter "orte_base_help_aggregate" to 0 to see all help / '
     "error messages"],
    ["-" * 74, "Two mutually-exclusive MCA variables were specified.  This can result",
     "in undefined behavior, such as ignoring the components that the MCA", "-" * 74],
    ["Warning: Permanently added '[192.168.173.233]:2022' (RSA) to the list of known hosts."],
    ["srun: job 812345 queued and waiting for resources"],
    ["[1748937999.151440] [TENCENT64:173504:0]     ucp_context.c:1951 UCX  WARN  UCP API "
     "version is incompatible: required >= 1.15, actual 1.14.0 (loaded from "
     "/usr/lib64/libucp.so.0)"],
    ["Authorization required, but no authorization protocol specified"],
    ["root@moons:~/nccl-tests-master# NCCL_P2P_LEVEL=SYS ./build/alltoall_perf -b 8 -e 128M"],
    ["mpirun -np 8 -H node1:4,node2:4 ./build/all_reduce_perf -b 8 -e 8G -f 2 -g 1"],
    ["```"],
    ["[...]"],
    ["..."],
]


def _strip(data: Any) -> Any:
    """Facts without line numbers and the lists the noise itself goes to.

    A pasted command line is noise to the table but evidence of the run (`-np`, `-g`, `-e`,
    the binary where no banner names it): what it says is kept in `command`, `binary`, `op`
    and counted in `ranks_total` (an elision in the table sets `rows_elided`), so those are
    left out here
    (tests/unit/parsers/test_nccl_ranks.py pins them)."""
    if isinstance(data, dict):
        return {k: _strip(v) for k, v in data.items()
                if k not in ("line_no", "ignored_lines", "edits", "lines", "line", "command",
                             "ranks_total", "binary", "op", "rows_elided")}
    if isinstance(data, list):
        return [_strip(v) for v in data]
    return data


def _insert(lines: list[str], at: list[int], units: list[list[str]]) -> list[str]:
    """`units` at positions of the original lines, so no unit lands inside another."""
    out = list(lines)
    for pos, unit in sorted(zip(at, units, strict=True), key=lambda pu: -pu[0]):
        out[pos:pos] = unit
    return out


def _check(parse: Callable[[str], BaseModel], text: str, data: st.DataObject,
           positions: Callable[[list[str]], list[int]]) -> None:
    lines = text.splitlines()
    clean = parse(text)
    allowed = positions(lines)
    n = data.draw(st.integers(1, 4))
    at = data.draw(st.lists(st.sampled_from(allowed), min_size=n, max_size=n))
    units = data.draw(st.lists(st.sampled_from(NOISE), min_size=n, max_size=n))
    noisy = parse("\n".join(_insert(lines, at, units)) + "\n")
    assert _strip(noisy.model_dump(mode="json")) == _strip(clean.model_dump(mode="json"))
    inserted = sum(len(u) for u in units)
    ignored = getattr(noisy, "ignored_lines", [])
    assert len(ignored) - len(getattr(clean, "ignored_lines", [])) == inserted
    elisions = sum(u in (["[...]"], ["..."]) for u in units)
    # an inserted `mpirun -np 8` says more ranks than a one-GPU log lists: that edit is the
    # command line's evidence, not noise (pinned in test_nccl_ranks.py)
    edits = [e for e in getattr(noisy, "edits", []) if "rank line(s) listed" not in e.what]
    assert bool(edits) == bool(elisions or getattr(clean, "edits", []))


def _anywhere(lines: list[str]) -> list[int]:
    return list(range(len(lines) + 1))


def _between_boxes(lines: list[str]) -> list[int]:
    """Around the boxes of the nvidia-smi table: a line inside one is part of the table."""
    return [i for i in range(len(lines) + 1)
            if i in (0, len(lines)) or not lines[i - 1].strip() or not lines[i].strip()]


NCCL_LOGS = [FIX / "recipe-h200x1" / "nccl-tests" / "all-reduce-1.log",
             FIX / "h200x2" / "nccl-tests" / "all_reduce_8B-128M_g2_round1.log",
             FIX / "nccl-tests" / "all_reduce_2.13-era_dgx-a100-80g.log",
             FIX / "nccl-tests" / "all_reduce_2.11-era_error-column_dgx-a100.log",
             FIX / "nccl-tests" / "all_reduce_2node-h100_ib-gdrdma_nccl-info.log",
             FIX / "recipe-h200x1-extras" / "coll-hypercube.log"]


@FUZZ
@given(st.sampled_from(NCCL_LOGS), st.data())
def test_nccl_tests_facts_survive_noise(path: Path, data: st.DataObject) -> None:
    _check(parse_nccl_tests, path.read_text(), data, _anywhere)


@FUZZ
@given(st.sampled_from([FIX / "h200x2" / "nccl-tests" / "all_reduce_mpi_np2_simulated-2node-"
                                                         "socket.log",
                        FIX / "nccl-tests" / "all_reduce_2node-h100_ib-gdrdma_nccl-info.log"]),
       st.data())
def test_nccl_info_facts_survive_noise(path: Path, data: st.DataObject) -> None:
    _check(parse_nccl_debug, path.read_text(), data, _anywhere)


@FUZZ
@given(st.sampled_from([FIX / "h200x2" / "commands" / "nvidia-smi-q.txt",
                        FIX / "public" / "nvidia-smi-q_titan-v_r560.txt",
                        FIX / "public" / "nvidia-smi-q_fabric-in-progress_gpu-operator.txt"]),
       st.data())
def test_nvidia_smi_q_facts_survive_noise(path: Path, data: st.DataObject) -> None:
    _check(parse_nvidia_smi_q, path.read_text(), data, _anywhere)


@FUZZ
@given(st.sampled_from([FIX / "h200x2" / "commands" / "nvidia-smi.txt",
                        FIX / "public" / "nvidia-smi_h200-mig-load_r590.txt",
                        FIX / "public" / "nvidia-smi_a100-pcie-mig-no-devices_r510.txt"]),
       st.data())
def test_nvidia_smi_table_facts_survive_noise(path: Path, data: st.DataObject) -> None:
    _check(parse_nvidia_smi_table, path.read_text(), data, _between_boxes)
