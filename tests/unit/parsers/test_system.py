from __future__ import annotations

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers import parse
from orchestrator.parsers.system import (
    IbvDevinfoFacts,
    parse_df,
    parse_ibv_devinfo,
    parse_ldconfig_nccl,
    parse_lscpu,
    parse_meminfo,
    parse_mpirun_version,
    parse_nvcc,
    parse_os_release,
    parse_torch_info,
    parse_uname,
)


def test_uname_real(real) -> None:
    facts = parse_uname(real("uname.txt"))
    assert facts.kernel_release == "6.18.44-fc-v657-gpu"
    assert facts.machine == "x86_64" and facts.hostname == "vm"
    with pytest.raises(ParseError):
        parse_uname("bash: uname: command not found\n")


def test_os_release_real(real) -> None:
    facts = parse_os_release(real("os-release.txt"))
    assert (facts.id, facts.version_id) == ("ubuntu", "24.04")
    assert facts.pretty_name == "Ubuntu 24.04.3 LTS"
    assert facts.fields["VERSION_CODENAME"] == "noble"
    with pytest.raises(ParseError) as exc:
        parse_os_release('ID=ubuntu\nthis is not\n')
    assert exc.value.line_no == 2


def test_nvcc(real, synth) -> None:
    facts = parse_nvcc(real("nvcc-version.txt"))
    assert facts.release == "13.0"
    assert facts.version == "13.0.88"
    assert facts.build == "cuda_13.0.r13.0/compiler.36424714_0"
    assert parse_nvcc(synth("nvcc-version_12.4.txt")).release == "12.4"
    with pytest.raises(ParseError):
        parse_nvcc("sh: 1: nvcc: not found\n")


def test_ldconfig(real, synth) -> None:
    facts = parse_ldconfig_nccl(real("ldconfig-nccl.txt"))
    assert facts.paths == ["/lib/x86_64-linux-gnu/libnccl.so.2",
                           "/lib/x86_64-linux-gnu/libnccl.so"]
    full = parse_ldconfig_nccl(synth("ldconfig-p_full.txt"))
    assert [lib.name for lib in full.libraries] == ["libnccl.so.2", "libnccl.so",
                                                   "libnccl-net.so"]
    assert full.libraries[0].path == "/usr/lib/x86_64-linux-gnu/libnccl.so.2"
    assert parse_ldconfig_nccl("").libraries == []
    with pytest.raises(ParseError) as exc:
        parse_ldconfig_nccl("\tlibnccl.so.2 (libc6,x86-64) => /x\nldconfig: oops\n")
    assert exc.value.line_no == 2


def test_torch_real(real) -> None:
    facts = parse_torch_info(real("torch-info.txt"))
    assert facts.torch == "2.11.0+cu130" and facts.cuda == "13.0" and facts.nccl == "2.28.9"
    assert facts.available is True and facts.count == 2
    assert facts.devices[1].memory_bytes == 150109880320 and facts.devices[1].cc == [9, 0]


def test_torch_no_cuda(synth) -> None:
    facts = parse_torch_info(synth("torch-info_no-cuda.txt"))
    assert facts.nccl is None and facts.available is False and facts.count == 0


def test_torch_errors() -> None:
    text = "Traceback (most recent call last):\nModuleNotFoundError: No module named 'torch'\n"
    with pytest.raises(ParseError) as exc:
        parse_torch_info(text)
    assert exc.value.line_no == 2
    with pytest.raises(ParseError) as exc:
        parse_torch_info('warn\n{"torch": "2.3.1"}\n')
    assert exc.value.line_no == 2


def test_ibv_devinfo_dgx(synth) -> None:
    facts = parse("ibv-devinfo", synth("ibv_devinfo_dgx-a100.txt"))
    assert isinstance(facts, IbvDevinfoFacts)
    assert [d.hca_id for d in facts.devices] == [f"mlx5_{k}" for k in range(10)]
    d0 = facts.devices[0]
    assert d0.transport == "InfiniBand" and d0.fw_ver == "20.31.1014"
    assert d0.node_guid == "0c42:a103:0000:7e3a"
    p = d0.ports[0]
    assert (p.port, p.state, p.active_mtu, p.link_layer) == (1, "PORT_ACTIVE", 4096, "InfiniBand")
    assert p.rate_gbps is None  # plain ibv_devinfo has no width/speed
    assert facts.devices[3].ports[0].state == "PORT_INIT"


def test_ibv_devinfo_verbose(synth) -> None:
    facts = parse_ibv_devinfo(synth("ibv_devinfo-v_hdr-roce.txt"))
    hdr, down, roce = (d.ports[0] for d in facts.devices)
    assert hdr.active_width == "4X" and hdr.active_speed_gbps == 50.0 and hdr.rate_gbps == 200.0
    assert hdr.phys_state == "LINK_UP"
    assert down.state == "PORT_DOWN" and down.phys_state == "DISABLED"
    assert roce.link_layer == "Ethernet" and roce.active_mtu == 1024 and roce.rate_gbps == 100.0


def test_ibv_devinfo_none_and_missing(synth, real) -> None:
    facts = parse_ibv_devinfo(synth("ibv_devinfo_none.txt"))
    assert facts.devices == [] and facts.message == "No IB devices found"
    with pytest.raises(ParseError) as exc:
        parse_ibv_devinfo(real("ibv_devinfo.txt"))
    assert exc.value.line_no == 1


def test_lscpu(real, synth) -> None:
    h = parse_lscpu(real("lscpu.txt"))
    assert (h.cpus, h.sockets, h.cores_per_socket, h.threads_per_core, h.numa_nodes) == (
        32, 1, 32, 1, 1)
    assert h.model_name == "Intel(R) Xeon(R) Processor"
    d = parse_lscpu(synth("lscpu_dgx-a100.txt"))
    assert d.model_name == "AMD EPYC 7742 64-Core Processor"
    assert (d.cpus, d.sockets, d.cores_per_socket, d.threads_per_core, d.numa_nodes) == (
        256, 2, 64, 2, 8)
    assert d.fields["NUMA node3 CPU(s)"] == "48-63,176-191"
    with pytest.raises(ParseError) as exc:
        parse_lscpu("CPU(s): 4\ngarbage\n")
    assert exc.value.line_no == 2


def test_meminfo(real, synth) -> None:
    assert parse_meminfo(real("meminfo.txt")).mem_total_kb == 263998500
    m = parse_meminfo(synth("meminfo_dgx-a100.txt"))
    assert m.mem_available_kb == 2079838212 and m.values["HugePages_Total"] == 0
    with pytest.raises(ParseError):
        parse_meminfo("MemFree: 1 kB\n")
    with pytest.raises(ParseError) as exc:
        parse_meminfo("MemTotal: 1 kB\nMemFree: lots\n")
    assert exc.value.line_no == 2


def test_df_human_real(real) -> None:
    facts = parse_df(real("df.txt"))
    assert facts.rounded is True
    e = facts.entries[0]
    assert (e.filesystem, e.fstype, e.mount) == ("/dev/vda", "ext4", "/")
    assert e.size_bytes == 252 * 1024**3
    assert facts.fstype_of("/tmp") == "ext4"


def test_df_posix(synth) -> None:
    facts = parse_df(synth("df-PT_work-ckpt.txt"))
    assert facts.rounded is False
    root, ckpt = facts.entries
    assert root.fstype == "overlay" and root.avail_bytes == 376317192 * 1024
    assert ckpt.filesystem == "10.128.0.12:/export/ckpt" and ckpt.mount == "/mnt/ckpt"
    assert facts.fstype_of("/mnt/ckpt/run1") == "nfs4"
    assert facts.fstype_of("/mnt/ckptx") == "overlay"


def test_df_wrapped_and_errors(synth) -> None:
    facts = parse_df(synth("df-hT_wrapped.txt"))
    assert facts.entries[0].filesystem.startswith("/dev/mapper/ubuntu--vg")
    assert facts.entries[0].fstype == "ext4" and facts.entries[1].mount == "/raid"
    with pytest.raises(ParseError) as exc:
        parse_df("Filesystem Type 1024-blocks Used Available Capacity Mounted on\n"
                 "/dev/sda1 ext4 10 5 five 50% /\n")
    assert exc.value.line_no == 2
    with pytest.raises(ParseError) as exc:
        parse_df("df: /nope: No such file or directory\n")
    assert exc.value.line_no == 1


def test_mpirun(real, synth) -> None:
    facts = parse_mpirun_version(real("mpirun-version.txt"))
    assert (facts.implementation, facts.version) == ("Open MPI", "4.1.6")
    assert parse_mpirun_version(synth("mpirun-version_openmpi5.txt")).version == "5.0.3"
    mpich = parse_mpirun_version(synth("mpirun-version_mpich.txt"))
    assert (mpich.implementation, mpich.version) == ("MPICH", "4.0.2")
    intel = parse_mpirun_version(synth("mpirun-version_intel.txt"))
    assert (intel.implementation, intel.version) == ("Intel MPI", "2021.10")
    with pytest.raises(ParseError):
        parse_mpirun_version("bash: mpirun: command not found\n")


def test_ibv_devinfo_part_id_and_lids(synth) -> None:
    facts = parse_ibv_devinfo(synth("ibv_devinfo-v_hdr-roce.txt"))
    hdr, down, roce = facts.devices
    assert (hdr.vendor_part_id, hdr.ca_type, hdr.vendor_id) == (4123, "MT4123", "0x02c9")
    assert roce.ca_type == "MT4125"
    assert (hdr.ports[0].port_lid, hdr.ports[0].sm_lid) == (100, 1)
    assert (roce.ports[0].port_lid, roce.ports[0].sm_lid) == (0, 0)
    plain = parse_ibv_devinfo(synth("ibv_devinfo_dgx-a100.txt")).devices[0]
    assert plain.vendor_part_id == 4123 and plain.ports[0].port_lid == 100
    with pytest.raises(ParseError) as exc:
        parse_ibv_devinfo(synth("ibv_devinfo_dgx-a100.txt").replace(
            "vendor_part_id:\t\t\t4123", "vendor_part_id:\t\t\tConnectX", 1))
    assert exc.value.line_no is not None
