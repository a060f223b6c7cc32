"""Fixtures for the integration tests: a real cluster of sshd nodes.

Without root, a usable `ip netns` or sshd the tests are skipped; with
GPUVET_REQUIRE_CLUSTER=1 (CI) a missing prerequisite fails them instead.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import Cluster, missing_prerequisites  # noqa: E402
from slurm_cluster import SlurmCluster, missing_slurm  # noqa: E402

REQUIRE_ENV = "GPUVET_REQUIRE_CLUSTER"
DEFAULT_NODES = 3

_prereq_problems: list[str] | None = None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.integration)


def require_cluster_prerequisites() -> None:
    """Skip (or, with GPUVET_REQUIRE_CLUSTER=1, fail) when the cluster cannot be built."""
    global _prereq_problems
    if _prereq_problems is None:
        _prereq_problems = missing_prerequisites()
    if not _prereq_problems:
        return
    reason = "real test cluster unavailable: " + "; ".join(_prereq_problems)
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1 makes this a failure)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def cluster_prerequisites() -> None:
    """Use in tests that build their own Cluster (e.g. Cluster.start(32) for a benchmark)."""
    require_cluster_prerequisites()


@pytest.fixture(scope="session")
def cluster(cluster_prerequisites: None) -> Iterator[Cluster]:
    """A 3-node cluster shared by the whole session; torn down whatever happens.

    Leftovers of crashed earlier sessions are removed first (Cluster.start does it).
    """
    previous = signal.getsignal(signal.SIGTERM)

    def _on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt("SIGTERM")  # so teardown below still runs

    if previous in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _on_term)
    try:
        c = Cluster.start(DEFAULT_NODES)
        try:
            yield c
        finally:
            c.stop()
    finally:
        if previous in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


_slurm_problems: list[str] | None = None


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A 4-node Slurm cluster (slurmctld, munged, a slurmd per node namespace) shared by the
    session's Slurm tests (the fleet's pairs take all four; the drain test takes node3 out
    of service and back); skipped, or failed under GPUVET_REQUIRE_CLUSTER=1, when this
    machine cannot run one; torn down with every process in its namespaces."""
    global _slurm_problems
    if _slurm_problems is None:
        _slurm_problems = missing_slurm()
    if _slurm_problems:
        reason = "real Slurm test cluster unavailable: " + "; ".join(_slurm_problems)
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{reason} ({REQUIRE_ENV}=1 makes this a failure)", pytrace=False)
        pytest.skip(reason)
    previous = signal.getsignal(signal.SIGTERM)

    def _on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt("SIGTERM")  # so teardown below still runs

    if previous in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _on_term)
    try:
        c = SlurmCluster.start(4)
        try:
            yield c
        finally:
            c.stop()
    finally:
        if previous in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
