"""``python3 -m payload <subcommand> [options]``.

Each subcommand is a module with ``add_arguments(parser)`` and
``main(args) -> int``; add new ones to ``SUBCOMMANDS``.
"""

import argparse
import importlib
import sys
from typing import List, Optional, Tuple

# (name, module, one-line help).
SUBCOMMANDS: List[Tuple[str, str, str]] = [
    ("collect", "payload.collect", "run the fixed command list and write one JSON document"),
    ("fabric", "payload.fabric",
     "one read-only snapshot of the InfiniBand/RoCE ports: states, error counters, P_Keys, GIDs"),
    ("nccl-build", "payload.ncclbuild", "build nccl-tests at a commit, cached by toolchain"),
    ("allreduce-bench", "payload.allreduce",
     "torch.distributed all_reduce benchmark in nccl-tests' columns (run under torchrun)"),
    ("train", "payload.train.loop",
     "the training step's rank program: a small GPT, checkpoints (run under torchrun)"),
    ("train-supervise", "payload.train.supervise",
     "run one phase of the training step, sample GPU telemetry, SIGKILL it at a chosen point"),
    ("train-probe", "payload.train.probe",
     "where the checkpoint directory lives and which nodes share it"),
    ("nodecheck", "payload.nodecheck",
     "is this node fit for a job, in seconds (Slurm's HealthCheckProgram or a Prolog)"),
    ("health", "payload.health.node",
     "test every GPU of this node at once: bandwidth, products, memory, links, counters"),
    ("health-gpu", "payload.health.gpu",
     "one GPU's phases of the health step (started by `health`, one per GPU)"),
    ("health-links", "payload.health.links",
     "host copies and the peer matrix of the health step (started by `health`)"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python3 -m payload", description=__doc__)
    sub = parser.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
    for name, module_name, help_text in SUBCOMMANDS:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module_name)
        module = importlib.import_module(module_name)
        module.add_arguments(p)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "subcommand", None):
        parser.print_help(sys.stderr)
        return 2
    module = importlib.import_module(args._module)
    return int(module.main(args))


if __name__ == "__main__":
    sys.exit(main())
