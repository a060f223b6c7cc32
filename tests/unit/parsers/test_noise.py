"""The shared reader of "tool output vs known noise": each kind of noise, elisions, prefixes."""

from __future__ import annotations

import pytest

from orchestrator.parsers._noise import NoiseReader, split_by_rank, strip_launcher_prefix


@pytest.mark.parametrize(("line", "kind"), [
    # lines as the public fixtures hold them (tests/fixtures/public/README.md)
    ("[R6KD-CX8aaS-GPU-14:12807] 15 more processes have sent help message "
     "help-mca-var.txt / mutually-exclusive-vars", "openmpi-help"),
    ("[vm:1816] 8 more processes have sent help message help-mtl-ofi.txt / OFI call fail",
     "openmpi-help"),
    ('[vm:1816] Set MCA parameter "orte_base_help_aggregate" to 0 to see all help / error '
     "messages", "openmpi-help"),
    ("[neutron-nvidia:825452] *** Process received signal ***", "openmpi"),
    ("Warning: Permanently added '[192.168.173.233]:2022' (RSA) to the list of known hosts.",
     "ssh"),
    ("srun: job 4242 queued and waiting for resources", "slurm"),
    ("[1748937999.151440] [TENCENT64:173504:0]     ucp_context.c:1951 UCX  WARN  UCP API "
     "version is incompatible: required >= 1.15, actual 1.14.0", "ucx"),
    ("Authorization required, but no authorization protocol specified", "x11"),
    ("root@moons:~/nccl-tests-master# NCCL_P2P_LEVEL=SYS ./build/alltoall_perf -b 8", "shell-prompt"),
    ("ih@ip-172-31-22-230:~/nccl-tests/src$ mpirun -host localhost -np 2 all_reduce_perf",
     "shell-prompt"),
    ("(base) gandiva@v100-gpu-1:~/nccl-tests$ mpirun --bind-to none ./build/broadcast_perf",
     "shell-prompt"),
    ("[root@localhost:~] nvidia-smi", "shell-prompt"),
    ("$ NCCL_DEBUG=INFO ./build/all_reduce_perf -b 8 -e 128M -f 2 -g 2", "shell-prompt"),
    ("mpirun -np 8 all_reduce_perf -b 32 -f 2 -e 8G", "command-line"),
    ("NCCL_DEBUG=WARN ./build/all_reduce_perf -b 8 -e 128M -f 2 -g 1", "command-line"),
    ("/root/nccl-tests-master/build/alltoall_perf -b 1M -e 32G -f 2 -g 8 -n 100", "command-line"),
    ("```", "markdown"),
    ("_____________________________________________", "markdown"),
])
def test_known_noise_by_whom(line: str, kind: str) -> None:
    n = NoiseReader()
    assert n.kind(line) == kind
    assert n.skip(7, line)
    assert [(i.line_no, i.kind, i.text) for i in n.ignored] == [(7, kind, line)]
    assert n.edits == []


@pytest.mark.parametrize("line", [
    "           8             2     float     sum      -1    12.90    0.00    0.00      0",
    "# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 1",
    "vm:1816:1816 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>",
    "    Product Name                          : NVIDIA H200",
    "|   0  NVIDIA H200                    On  |   00000000:00:06.0 Off |                    0 |",
    "GPU 0: NVIDIA H200 (UUID: GPU-724d78fc-1a5e-f6d9-e6c2-cb697e0fe053)",
])
def test_tool_output_is_never_noise(line: str) -> None:
    n = NoiseReader()
    assert n.kind(line) is None and not n.skip(1, line) and n.ignored == []


def test_an_openmpi_banner_block_is_mpirun_s_whatever_it_says() -> None:
    block = ["-" * 74, "Primary job  terminated normally, but 1 process returned",
             "a non-zero exit code. Per user-direction, the job has been aborted.", "-" * 74]
    n = NoiseReader()
    assert [n.skip(i, ln) for i, ln in enumerate(block, 1)] == [True] * 4
    assert not n.in_banner
    assert n.kind("    33554432       8388608   float     sum   1464.2") is None


@pytest.mark.parametrize("line", ["...", "[...]", "  [ ... ]", "…", "[snip]", "<snip>", "(...)",
                                  "[truncated]", "    .....  "])
def test_an_elision_is_noise_and_an_edit(line: str) -> None:
    n = NoiseReader()
    assert n.skip(12, line)
    assert n.ignored[0].kind == "elision"
    assert [(e.line_no, e.what.split(" (")[0]) for e in n.edits] == [(12, "an elision mark")]


def test_the_same_edit_is_said_once() -> None:
    n = NoiseReader()
    n.edit(3, "a lost #")
    n.edit(9, "a lost #")
    assert [e.line_no for e in n.edits] == [3]


def test_prefixes_are_stripped_only_when_most_lines_carry_them() -> None:
    tagged = ["[1,0]<stdout>:# nThread 1", "[1,0]<stdout>:#", "plain"]
    lines, who = strip_launcher_prefix(tagged)
    assert who == "mpirun --tag-output" and lines == ["# nThread 1", "#", "plain"]
    rows = ["  0: a", "1 2 3", "4 5 6"]
    assert strip_launcher_prefix(rows) == (rows, None)


def test_two_ranks_outputs_are_split_by_their_tags() -> None:
    text = ("[1,0]<stdout>:GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaa)\n"
            "[1,1]<stdout>:GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-bbbb)\n"
            "[1,0]<stdout>:GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-cccc)\n")
    split = split_by_rank(text)
    assert split is not None
    who, parts = split
    assert who == "mpirun --tag-output" and list(parts) == ["0", "1"]
    assert parts["0"].splitlines() == ["GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaa)",
                                       "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-cccc)"]
    assert split_by_rank(" 0: one\n 0: two\n") is None  # one rank: nothing to split
    assert split_by_rank("no prefix\n") is None
