"""Memory each rank used: the allocator's peaks on a GPU, the resident set on a CPU,
from each rank's last step (or its end record)."""

from __future__ import annotations

from orchestrator.judging.sink import Sink
from orchestrator.steps.train.reading import PhaseOutput
from payload.train import protocol

_PEAKS = (("mem_alloc_peak", "peak_mem_allocated_bytes"),
          ("mem_reserved_peak", "peak_mem_reserved_bytes"),
          ("rss_peak", "peak_rss_bytes"))


def memory(sink: Sink, out: PhaseOutput) -> None:
    """One measurement per rank and peak, tagged with the rank and its node."""
    for rank, evs in out.ranks.items():
        last = next((e for e in reversed(evs) if e.get("event") in (protocol.END,
                                                                    protocol.STEP)), None)
        if last is None:
            continue
        node = out.node_of(rank)
        for key, metric in _PEAKS:
            if last.get(key) is not None:
                sink.measure(metric, float(last[key]), "bytes", rank=rank, node=node)
