"""The GPUs against the order: driver, count, model, memory, form factor, MIG, health.

Health is what the card says about itself before any load: PCIe link width and
generation, power limit, temperature, clocks held back, ECC, retired and
remapped memory, error states.
"""

from __future__ import annotations

from orchestrator import gpunames
from orchestrator.gpunames import form_factor_of
from orchestrator.inventory import Expectations
from orchestrator.parsers.gpus import GpuView
from orchestrator.parsers.nvidia_smi import NvidiaSmiLFacts, QueryGpuFacts
from orchestrator.parsers.nvidia_smi_q import NvidiaSmiQFacts
from orchestrator.parsers.nvidia_smi_table import NvidiaSmiTableFacts
from orchestrator.parsers.nvidia_smi_xml import NvidiaSmiXmlFacts
from orchestrator.records import Severity
from orchestrator.steps.preflight.facts import NodeFacts, Result, gpu_outputs, gpu_views
from orchestrator.suite import PreflightParams

# Delivered memory below this share of the order is a different card, not rounding:
# an "80 GB" A100 reports 79.2 GiB (81920 MiB minus ECC and reserve); a 40 GB one 39.6.
MEMORY_TOLERANCE = 0.93
# the outputs whose failure to parse means nvidia-smi answered but gpuvet could not read it
_NVSMI_IDS = ("query_gpu", "nvidia_smi_L", "nvidia_smi_q_xml", "nvidia_smi")


def _gpu_ev(nf: NodeFacts, views: list[GpuView], *facts: str) -> list[str]:
    told = {c for v in views for c in (v.source(*facts) if facts else v.sources)}
    return nf.ev(*[cid for cid, _ in gpu_outputs(nf) if cid in told])


def _attached(nf: NodeFacts) -> int | None:
    counts = [f.attached_gpus for _, f in gpu_outputs(nf)
              if isinstance(f, (NvidiaSmiXmlFacts, NvidiaSmiQFacts)) and f.attached_gpus is not None]
    return max(counts, default=None)


def check_driver(nf: NodeFacts, ex: Expectations, p: PreflightParams) -> list[Result]:
    outputs = gpu_outputs(nf)
    if outputs:
        if all(isinstance(f, NvidiaSmiLFacts) for _, f in outputs):
            # nvidia-smi -L answered, nothing with details did: say so, never pass silently
            smi = nf.command("query_gpu")
            why = nf.parse_errors.get("query_gpu") or (
                (smi.get("stderr") or smi.get("stdout") or "no output").strip()[-200:])
            return [Result("GPU_DETAILS_MISSING", "FAIL", "nvidia-smi lists GPUs but "
                           f"--query-gpu gave nothing usable ({why}): count, model, memory and "
                           "health were not checked", nf.ev("query_gpu", "nvidia_smi_L"))]
        return []
    smi = nf.command("query_gpu")
    unread = {c: m for c, m in nf.parse_errors.items() if c in _NVSMI_IDS}
    if smi.get("missing"):
        why = "nvidia-smi is not installed or not on PATH: no NVIDIA driver on this node"
    elif smi.get("timed_out"):
        why = "nvidia-smi hung (timed out): the driver or a GPU is in a bad state"
    elif unread:
        # nvidia-smi ran and printed something: the driver is there, gpuvet could not read it
        shown = "; ".join(f"{c}: {m}" for c, m in unread.items())
        return [Result("NVIDIA_SMI_UNREADABLE", "FAIL", "nvidia-smi answered but its output "
                       f"could not be read ({shown}): model, count, memory, MIG and health were "
                       "not checked; the raw output is kept as evidence", nf.ev(*unread),
                       {"unreadable": unread})]
    else:
        tail = (smi.get("stderr") or smi.get("stdout") or "").strip().splitlines()[-1:] or [""]
        why = f"nvidia-smi failed (exit {smi.get('rc')}): {tail[0]}"
    return [Result("NVIDIA_DRIVER_MISSING", "FAIL", why + "; GPU checks skipped",
                   nf.ev_failed("query_gpu"))]


def check_gpus(nf: NodeFacts, ex: Expectations, p: PreflightParams) -> list[Result]:
    views = gpu_views(nf)
    if not views:
        return []
    if all(isinstance(f, NvidiaSmiLFacts) for _, f in gpu_outputs(nf)):
        return _mig(nf, views, ex)  # a bare listing still shows MIG devices
    out: list[Result] = []
    listed = [c for c in ("query_gpu", "nvidia_smi_L") if c in nf.facts]
    ev = nf.ev(*listed) if listed else _gpu_ev(nf, views)
    names = sorted({v.name or "?" for v in views})
    if ex.gpus_per_node is not None:
        found = max(len(views), _attached(nf) or 0)
        ok = found == ex.gpus_per_node
        out.append(Result("GPU_COUNT", "PASS" if ok else "FAIL",
                          f"{found} GPU(s) found, {ex.gpus_per_node} ordered", ev,
                          {"found": found, "ordered": ex.gpus_per_node}))
    if ex.gpu_model:
        out.append(_model(ex.gpu_model, views, ev))
    if ex.memory_per_gpu_gb:
        out += _memory(nf, views, ex.memory_per_gpu_gb)
    if ex.form_factor:
        got = {form_factor_of(n) for n in names}
        if got == {ex.form_factor}:
            out.append(Result("FORM_FACTOR", "PASS", f"{ex.form_factor.upper()} as ordered", ev))
        elif None in got:
            out.append(Result("FORM_FACTOR", "INFO", f"form factor not evident from the name "
                              f"({', '.join(names)}); see the topology checks", ev))
        else:
            out.append(Result("FORM_FACTOR", "FAIL", f"{', '.join(names)} is "
                              f"{'/'.join(sorted(str(g) for g in got)).upper()}, "
                              f"{ex.form_factor.upper()} ordered", ev))
    out += _mig(nf, views, ex)
    return out


def _model(order: str, views: list[GpuView], ev: list[str]) -> Result:
    """The order's variants against each GPU's, as gpunames places them: by the name, or by
    the PCI device id where the driver cannot name the card."""
    want = gpunames.place(order)
    allows = f"; the order allows {want.labels}" if want.cards else ""
    bad: list[str] = []
    cut: list[int] = []  # a shortened table name
    unnamed: list[int] = []  # "NVIDIA Graphics Device" and no PCI device id
    told: list[str] = []
    matched: list[str] = []
    for v in views:
        ident = gpunames.identify(v.name, v.pci_device_id)
        if not ident.cards:
            if v.name is None:
                cut.append(v.index)
            elif gpunames.GENERIC.match(v.name):
                unnamed.append(v.index)
            else:
                bad.append(f"GPU{v.index} {v.name} (no card gpuvet knows)")
            continue
        if ident.how != gpunames.BY_NAME:
            told.append(f"GPU{v.index} {v.name or '?'} identified {ident.how} as "
                        f"{ident.labels}")
        if gpunames.matches(order, ident.cards):
            matched += [c.label for c in ident.cards if c.label not in matched]
        else:
            bad.append(f"GPU{v.index} {v.name or '?'} ({ident.labels})")
    note = f"; {'; '.join(told)}" if told else ""
    names = ", ".join(sorted({v.name or "?" for v in views}))
    details = {"ordered": [c.label for c in want.cards], "matched": matched}
    if bad:
        return Result("GPU_MODEL", "FAIL", f"GPU model differs from the order ({order}): "
                      + ", ".join(bad) + allows + note, ev, details)
    if cut or unnamed:
        why = "; ".join(x for x in (
            f"not reported in full for GPUs {cut} (a shortened table name)" if cut else "",
            f"GPUs {unnamed} are named 'NVIDIA Graphics Device' (a driver older than the card) "
            "and no PCI device id was read" if unnamed else "") if x)
        return Result("GPU_MODEL", "WARN", f"GPU model {why}: {order} unverified" + note, ev,
                      details)
    return Result("GPU_MODEL", "PASS", f"{names} matches {', '.join(matched)} (ordered "
                  f"{order}){note}", ev, details)


def _memory(nf: NodeFacts, views: list[GpuView], want_gib: float) -> list[Result]:
    ev = _gpu_ev(nf, views, "memory_total_mib")
    small = [f"GPU{v.index} {v.memory_total_mib / 1024:.1f} GiB" for v in views
             if v.memory_total_mib is not None
             and v.memory_total_mib / 1024 < want_gib * MEMORY_TOLERANCE]
    unknown = [v.index for v in views if v.memory_total_mib is None]
    if small:
        return [Result("GPU_MEMORY", "FAIL", f"GPU memory below the {want_gib:g} GB ordered: "
                       + ", ".join(small), ev)]
    if unknown:
        return [Result("GPU_MEMORY", "WARN", f"memory not reported for GPUs {unknown}", ev)]
    return [Result("GPU_MEMORY", "PASS", f"every GPU has >= {want_gib:g} GB", ev)]


def _mig(nf: NodeFacts, views: list[GpuView], ex: Expectations) -> list[Result]:
    out: list[Result] = []
    ev = _gpu_ev(nf, views, "mig_enabled", "mig_devices")
    mig_on = [v.index for v in views if v.mig_enabled]
    devices = sum(v.mig_devices or 0 for v in views)
    if mig_on and not ex.mig_allowed:
        out.append(Result("MIG_ENABLED", "FAIL",
                          f"MIG is enabled on GPUs {mig_on} ({devices} MIG device(s)): "
                          "you get slices, not whole GPUs", ev,
                          {"gpus": mig_on, "mig_devices": devices}))
    empty = [v.index for v in views if v.mig_enabled and v.mig_devices == 0]
    if empty:
        out.append(Result("MIG_NO_DEVICES", "FAIL", f"MIG mode is on for GPUs {empty} but no MIG "
                          "device exists there: CUDA cannot use those GPUs at all until GPU and "
                          "compute instances are created (nvidia-smi mig -cgi ... -C) or MIG is "
                          "turned off", ev, {"gpus": empty}))
    return out


def _pcie(nf: NodeFacts, v: GpuView, ex: Expectations) -> list[Result]:
    out: list[Result] = []
    g, ev = f"GPU{v.index}", nf.ev(*v.source("pcie_gen_current", "pcie_gen_max",
                                            "pcie_width_current", "pcie_width_max",
                                            "pcie_gen_host_max"))
    cap_gen = v.pcie_gen_max
    if cap_gen is not None and v.pcie_gen_host_max is not None:
        cap_gen = min(cap_gen, v.pcie_gen_host_max)
    host = (f"; the slot allows only Gen{v.pcie_gen_host_max}" if v.pcie_gen_host_max is not None
            and v.pcie_gen_max is not None and v.pcie_gen_host_max < v.pcie_gen_max else "")
    width_low = (v.pcie_width_current is not None and v.pcie_width_max is not None
                 and v.pcie_width_current < v.pcie_width_max)
    gen_low = (v.pcie_gen_current is not None and v.pcie_gen_max is not None
               and v.pcie_gen_current < v.pcie_gen_max)
    if width_low or gen_low:
        out.append(Result("PCIE_LINK_DEGRADED", "WARN",
                          f"{g} PCIe link Gen{v.pcie_gen_current} x{v.pcie_width_current}, "
                          f"capable of Gen{v.pcie_gen_max} x{v.pcie_width_max} (an idle GPU may "
                          "lower its generation to save power; a narrower width is not that)"
                          + host, ev))
    if ex.pcie.min_gen and cap_gen is not None and cap_gen < ex.pcie.min_gen:
        out.append(Result("PCIE_BELOW_ORDER", "FAIL", f"{g} PCIe Gen{cap_gen} max, "
                          f"Gen{ex.pcie.min_gen} ordered{host}: the link can never reach it", ev))
    if ex.pcie.min_width:
        width = v.pcie_width_current if v.pcie_width_current is not None else v.pcie_width_max
        if width is not None and width < ex.pcie.min_width:
            out.append(Result("PCIE_BELOW_ORDER", "FAIL", f"{g} PCIe x{width}"
                              f"{' max' if v.pcie_width_current is None else ''}, "
                              f"x{ex.pcie.min_width} ordered", ev))
    return out


def check_health(nf: NodeFacts, ex: Expectations, p: PreflightParams) -> list[Result]:
    out: list[Result] = []
    for v in gpu_views(nf):
        g = f"GPU{v.index}"
        out += _pcie(nf, v, ex)
        if (v.power_limit_w is not None and v.power_max_limit_w is not None
                and v.power_limit_w < v.power_max_limit_w * 0.99):
            share = 100 * v.power_limit_w / v.power_max_limit_w
            out.append(Result("POWER_LIMIT_LOW", "WARN", f"{g} power limit {v.power_limit_w:g} W, "
                              f"the card allows {v.power_max_limit_w:g} W: expect lower clocks. "
                              f"Under sustained load the GPU is held at {share:.0f}% of its "
                              "power, so long jobs run slower than on a full-power card of the "
                              "same model; ask for the limit to be raised or price it in",
                              nf.ev(*v.source("power_limit_w", "power_max_limit_w")),
                              {"limit_w": v.power_limit_w, "max_w": v.power_max_limit_w}))
        if v.temperature_c is not None and v.temperature_c > p.max_temperature_c:
            out.append(Result("TEMPERATURE_HIGH", "WARN", f"{g} at {v.temperature_c} C "
                              f"(> {p.max_temperature_c:g} C) before any load",
                              nf.ev(*v.source("temperature_c"))))
        if v.clocks_event_reasons is not None and v.clocks_event_reasons.slowdown:
            out.append(Result("CLOCKS_HELD_BACK", "WARN", f"{g} clocks held back: "
                              + ", ".join(v.clocks_event_reasons.slowdown),
                              nf.ev(*v.source("clocks_event_reasons"))))
        if v.ecc_uncorrected:
            out.append(Result("ECC_UNCORRECTABLE", "FAIL", f"{g} has {v.ecc_uncorrected} "
                              "uncorrectable ECC error(s): ask the provider for another node",
                              nf.ev(*v.source("ecc_uncorrected"))))
        if v.retired_pages_pending:
            out.append(Result("RETIRED_PAGES_PENDING", "FAIL", f"{g} has retired pages pending: "
                              "the GPU needs a reset before its memory can be trusted",
                              nf.ev(*v.source("retired_pages_pending"))))
        if v.remapped_pending or v.remapped_failure or (v.remapped_uncorrectable or 0) > 0:
            what = ("a remapping failure" if v.remapped_failure else "row remapping pending"
                    if v.remapped_pending else f"{v.remapped_uncorrectable} uncorrectable "
                    "remapped row(s)")
            out.append(Result("REMAPPED_ROWS", "FAIL", f"{g} memory: {what}", nf.ev(
                *v.source("remapped_pending", "remapped_failure", "remapped_uncorrectable"))))
        if v.errors:
            out.append(Result("GPU_ERROR_STATE", "FAIL", f"{g} reported errors instead of "
                              f"values ({'; '.join(v.errors)}): the GPU may need a reset",
                              nf.ev(*v.sources)))
    return out + smi_warnings(nf)


# What nvidia-smi's own warnings beside its table mean: (code, severity, what to do)
_SMI_WARNINGS: dict[str, tuple[str, Severity, str]] = {
    "inforom-corrupted": ("GPU_INFOROM_CORRUPTED", "WARN", "its error counters and ECC "
                          "settings cannot be trusted; ask the provider to reflash or replace it"),
    "reset-required": ("GPU_RESET_REQUIRED", "FAIL", "the GPU must be reset before it can be "
                       "used; ask the provider for another node or a reset"),
    "device-handle": ("GPU_UNREACHABLE", "FAIL", "the driver cannot reach the GPU (fallen off "
                      "the bus or lost); ask the provider for another node"),
}


def smi_warnings(nf: NodeFacts) -> list[Result]:
    """nvidia-smi's warnings about a GPU (infoROM corrupted, a GPU it must reset or cannot
    reach), from every default table and --query-gpu CSV the node gave, each once."""
    out: list[Result] = []
    seen: set[tuple[str, str | None]] = set()
    for cid, facts in nf.facts.items():
        if not isinstance(facts, (NvidiaSmiTableFacts, QueryGpuFacts)):
            continue
        for w in facts.warnings:
            if (w.kind, w.pci) in seen:
                continue
            seen.add((w.kind, w.pci))
            code, sev, todo = _SMI_WARNINGS[w.kind]
            out.append(Result(code, sev, f"nvidia-smi: {w.text} (line {w.line_no}): {todo}",
                              nf.ev(cid), {"pci": w.pci, "reason": w.reason,
                                           "line_no": w.line_no}))
    return out

