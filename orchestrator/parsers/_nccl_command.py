"""A pasted command line beside an nccl-tests log (`mpirun -np 16 ... all_reduce_perf -g 8 -e
8G`): what it says about the ranks and sizes of the run, one of the sources the log's rank
count and maxBytes are taken from (`nccl_tests.py`)."""

from __future__ import annotations

import re

_LAUNCHER = re.compile(r"^(?:mpirun|mpiexec|srun|prterun)$")
_BINARY = re.compile(r"^\S*\w+_perf(?:_mpi)?$")
_LAUNCHER_OPTS = {"-np": "np", "-n": "np", "--np": "np", "--n": "np", "--ntasks": "np",
                  "-N": "nodes", "--nodes": "nodes", "--ntasks-per-node": "per_node",
                  "-npernode": "per_node", "--npernode": "per_node"}
_BINARY_OPTS = {"-g": "g", "--ngpus": "g", "-t": "t", "--nthreads": "t", "-b": "b",
                "--minbytes": "b", "-e": "e", "--maxbytes": "e"}
_SIZE = re.compile(r"^(\d+)([KMGT]?)$", re.I)


def command_facts(line: str) -> tuple[str | None, dict[str, int]]:
    """What a pasted launcher or binary command line says about ranks and sizes: the
    binary it names, and np, nodes, g, t, b, e as it gives them.

    Only options before the binary are the launcher's (`-n` after it is nccl-tests' own
    iteration count); each key is taken from the first command line that gives it.
    """
    toks = line.split()
    role = None
    binary: str | None = None
    got: dict[str, int] = {}
    i = 0
    while i < len(toks):
        tok = toks[i]
        if _LAUNCHER.match(tok.rsplit("/", 1)[-1]):
            role = "launcher"
        elif _BINARY.match(tok):
            role = "binary"
            binary = binary or tok.rsplit("/", 1)[-1]
        opts = _LAUNCHER_OPTS if role == "launcher" else _BINARY_OPTS if role else {}
        key, _, val = tok.partition("=")
        if key in opts:
            if not val and i + 1 < len(toks):
                val = toks[i + 1]
                i += 1
            n = _size(val) if opts[key] in ("b", "e") else (int(val) if val.isdigit() else None)
            if n is not None:
                got.setdefault(opts[key], n)
        i += 1
    if "np" not in got and "nodes" in got and "per_node" in got:
        got["np"] = got["nodes"] * got["per_node"]
    got.pop("per_node", None)
    return binary, got


def _size(text: str) -> int | None:
    m = _SIZE.match(text)
    if not m:
        return None
    return int(m[1]) * 1024 ** " KMGT".index((m[2] or " ").upper())
