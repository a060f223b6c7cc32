from __future__ import annotations

import pytest

from orchestrator.errors import ParseError
from orchestrator.parsers import parse
from orchestrator.parsers.system import (
    IbDevice,
    IbPort,
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


# ------------------------------------------------ whole records, limits, the error of each refusal

def _refused(func, text: str, what: str, line_no: int | None, line: str | None,
             kind: str) -> None:
    with pytest.raises(ParseError) as exc:
        func(text, source="f.txt")
    e = exc.value
    where = "f.txt" if line_no is None else f"f.txt:{line_no}"
    msg = f"cannot parse {kind} output at {where}: {what}"
    if line is not None:
        msg += f"\n  line: {line!r}"
    assert (e.kind, e.what, e.line_no, e.line, e.source) == (kind, msg, line_no, line, "f.txt")


def test_uname_whole_and_its_shapes(real) -> None:
    assert parse_uname(real("uname.txt")).model_dump() == {
        "kernel_name": "Linux", "hostname": "vm", "kernel_release": "6.18.44-fc-v657-gpu",
        "machine": "x86_64"}
    # busybox and macOS end with the machine itself; five words are enough
    assert parse_uname("Linux box 6.6.8-0-lts #1-Alpine SMP aarch64 Linux\n").machine == "aarch64"
    assert parse_uname("Darwin mac 23.1.0 Darwin arm64\n").model_dump() == {
        "kernel_name": "Darwin", "hostname": "mac", "kernel_release": "23.1.0",
        "machine": "arm64"}
    _refused(parse_uname, "Linux box 6.6.8 x86_64\n", "not one `uname -a` line", 1,
             "Linux box 6.6.8 x86_64", "uname")
    _refused(parse_uname, "\nLinux box v6.6 #1 x86_64 GNU/Linux\n", "not one `uname -a` line", 2,
             "Linux box v6.6 #1 x86_64 GNU/Linux", "uname")
    two = real("uname.txt") + "Linux vm2 6.1.0 #1 SMP x86_64 GNU/Linux\n"
    _refused(parse_uname, two, "not one `uname -a` line", 1, real("uname.txt").strip(), "uname")
    _refused(parse_uname, " \n", "empty output", None, None, "uname")


def test_os_release_quotes_comments_and_empty_values() -> None:
    facts = parse_os_release('# written by hand\nNAME="Rocky Linux"\nID=rocky\n'
                             "VERSION_ID='9.4'\nVARIANT=\nPRETTY_NAME=\"\"  \nX=\"\n")
    assert facts.model_dump() == {
        "id": "rocky", "version_id": "9.4", "pretty_name": "",
        "fields": {"NAME": "Rocky Linux", "ID": "rocky", "VERSION_ID": "9.4", "VARIANT": "",
                   "PRETTY_NAME": "", "X": '"'}}
    assert parse_os_release("NAME=Debian\n").model_dump() == {
        "id": None, "version_id": None, "pretty_name": None, "fields": {"NAME": "Debian"}}
    _refused(parse_os_release, "ID=ubuntu\nid=ubuntu\n", "not KEY=value", 2, "id=ubuntu",
             "os-release")


def test_nvcc_whole_and_refused(real) -> None:
    assert parse_nvcc(real("nvcc-version.txt")).model_dump() == {
        "release": "13.0", "version": "13.0.88", "build": "cuda_13.0.r13.0/compiler.36424714_0"}
    older = "Cuda compilation tools, release 10.1, V10.1.243\n"  # before `Build` lines
    assert parse_nvcc(older).model_dump() == {"release": "10.1", "version": "10.1.243",
                                              "build": None}
    _refused(parse_nvcc, "sh: 1: nvcc: not found\nmore\n",
             "no 'Cuda compilation tools, release X.Y' line", 1, "sh: 1: nvcc: not found",
             "nvcc-version")


def test_ldconfig_whole_and_its_headers(synth) -> None:
    full = parse_ldconfig_nccl(synth("ldconfig-p_full.txt"))
    assert full.model_dump() == {"libraries": [
        {"name": "libnccl.so.2", "flags": "libc6,x86-64",
         "path": "/usr/lib/x86_64-linux-gnu/libnccl.so.2"},
        {"name": "libnccl.so", "flags": "libc6,x86-64",
         "path": "/usr/lib/x86_64-linux-gnu/libnccl.so"},
        {"name": "libnccl-net.so", "flags": "libc6,x86-64",
         "path": "/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so"}]}
    text = ("Cache generated by: ldconfig (Ubuntu GLIBC 2.39-0ubuntu8) stable release version "
            "2.39\n\tlibnccl.so.2 (libc6,x86-64, OS ABI: Linux 3.2.0) => /opt/nccl/lib/x y.so  \n")
    (lib,) = parse_ldconfig_nccl(text).libraries
    assert (lib.flags, lib.path) == ("libc6,x86-64, OS ABI: Linux 3.2.0", "/opt/nccl/lib/x y.so")
    _refused(parse_ldconfig_nccl, "\tlibnccl.so.2 (libc6,x86-64) => /x\nldconfig: oops\n",
             "not an `ldconfig -p` entry", 2, "ldconfig: oops", "ldconfig-nccl")


def test_torch_info_refusals_say_why(real) -> None:
    line = real("torch-info.txt").strip()
    facts = parse_torch_info("warning: something\n" + line + "\n")
    assert facts.model_dump() == {
        "torch": "2.11.0+cu130", "cuda": "13.0", "nccl": "2.28.9", "available": True,
        "count": 2, "devices": [
            {"index": i, "name": "NVIDIA H200", "memory_bytes": 150109880320, "cc": [9, 0]}
            for i in (0, 1)]}
    # the last JSON line counts, whatever follows it
    assert parse_torch_info('{"bad": 1}\n' + line + "\nbye\n").count == 2
    _refused(parse_torch_info, "warn\n{not json\n",
             "bad torch JSON: Expecting property name enclosed in double quotes: line 1 "
             "column 2 (char 1)", 2, "{not json", "torch-info")
    with pytest.raises(ParseError) as exc:
        parse_torch_info('{"torch": "2.3.1"}\n')
    assert exc.value.what.startswith("cannot parse torch-info output at <text>:1: bad torch "
                                     "JSON: 5 validation errors for TorchInfoFacts\n")
    _refused(parse_torch_info, "Traceback (most recent call last):\nImportError: torch\n",
             "no JSON line (torch missing or crashed?)", 2, "ImportError: torch", "torch-info")


def test_ibv_devinfo_verbose_whole(synth) -> None:
    facts = parse_ibv_devinfo(synth("ibv_devinfo-v_hdr-roce.txt"))

    def port(state, phys, mtu, layer, speed, lid, sm):
        return {"port": 1, "state": state, "phys_state": phys, "max_mtu": 4096, "active_mtu": mtu,
                "link_layer": layer, "active_width": "4X", "active_speed_gbps": speed,
                "port_lid": lid, "sm_lid": sm}

    def dev(hca, fw, guid, part, board, p):
        return {"hca_id": hca, "transport": "InfiniBand", "fw_ver": fw, "node_guid": guid,
                "vendor_id": "0x02c9", "vendor_part_id": part, "board_id": board, "ports": [p]}

    assert facts.model_dump() == {"message": None, "devices": [
        dev("mlx5_0", "20.35.1012", "b83f:d203:00a6:4b10", 4123, "MT_0000000223",
            port("PORT_ACTIVE", "LINK_UP", 4096, "InfiniBand", 50.0, 100, 1)),
        dev("mlx5_1", "20.35.1012", "b83f:d203:00a6:4b11", 4123, "MT_0000000223",
            port("PORT_DOWN", "DISABLED", 4096, "InfiniBand", 2.5, 0, 1)),
        dev("mlx5_2", "22.36.1010", "1070:fd03:0015:8c2e", 4125, "MT_0000000359",
            port("PORT_ACTIVE", "LINK_UP", 1024, "Ethernet", 25.0, 0, 0))]}


def test_ibv_devinfo_ports_devices_and_messages() -> None:
    text = ("hca_id:\tmlx5_4\n\ttransport:\t\t\tInfiniBand (0)\n\tvendor_part_id:\t\t\t4129\n"
            "\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_INIT (2)\n\t\t\tactive_speed:\t\tinvalid speed\n"
            "\t\t\tfw_ver:\t\t\tnot a port key\n\t\t\tbogus_key:\t\t1\n"
            "\t\tport:\t2\n\t\t\tstate:\t\t\tPORT_ARMED (3)\n\t\t\tactive_width:\t\t8X (4)\n"
            "\t\t\tactive_speed:\t\t100.0 Gbps (128)\n")
    (d,) = parse_ibv_devinfo(text).devices
    assert (d.hca_id, d.transport, d.vendor_part_id, d.fw_ver, d.ca_type) == (
        "mlx5_4", "InfiniBand", 4129, None, "MT4129")
    p1, p2 = d.ports
    assert (p1.port, p1.state, p1.active_speed_gbps, p1.rate_gbps) == (1, "PORT_INIT", None, None)
    assert (p2.port, p2.state, p2.active_width, p2.rate_gbps) == (2, "PORT_ARMED", "8X", 800.0)
    assert IbDevice(hca_id="x").ca_type is None
    assert IbPort(port=1, active_speed_gbps=50.0).rate_gbps is None
    failed = parse_ibv_devinfo("Failed to get IB devices list: Function not implemented\n")
    assert (failed.devices, failed.message) == (
        [], "Failed to get IB devices list: Function not implemented")
    hca = "hca_id:\tmlx5_0\n\ttransport:\t\t\tInfiniBand (0)\n"
    _refused(parse_ibv_devinfo, hca + "No IB devices found\n", "unexpected message", 3,
             "No IB devices found", "ibv-devinfo")
    _refused(parse_ibv_devinfo, "\ttransport:\t\t\tInfiniBand (0)\n", "text before the first hca_id",
             1, "\ttransport:\t\t\tInfiniBand (0)", "ibv-devinfo")
    _refused(parse_ibv_devinfo, hca + "hca_id:\n", "expected `hca_id:`", 3, "hca_id:",
             "ibv-devinfo")
    _refused(parse_ibv_devinfo, hca + "\t\tport:\t1\n\t\t\tmax_mtu:\t\t(5)\n", "bad max_mtu value",
             4, "\t\t\tmax_mtu:\t\t(5)", "ibv-devinfo")
    _refused(parse_ibv_devinfo, hca + "\t\tport:\tone\n", "bad port value", 3, "\t\tport:\tone",
             "ibv-devinfo")


def test_lscpu_sections_first_values_and_counts() -> None:
    text = ("Architecture:  aarch64\nCPU(s):  72\nVendor ID:  ARM\nCaches (sum of all):\n"
            "Model name:  Neoverse-V2\nModel name:  second\nSocket(s):  -\n"
            "Core(s) per socket:  72\nThread(s) per core:  1\nNUMA node(s):  9\n")
    assert parse_lscpu(text).model_dump() == {
        "architecture": "aarch64", "model_name": "Neoverse-V2", "cpus": 72, "sockets": None,
        "cores_per_socket": 72, "threads_per_core": 1, "numa_nodes": 9,
        "fields": {"Architecture": "aarch64", "CPU(s)": "72", "Vendor ID": "ARM",
                   "Model name": "Neoverse-V2", "Socket(s)": "-", "Core(s) per socket": "72",
                   "Thread(s) per core": "1", "NUMA node(s)": "9"}}
    assert parse_lscpu("Flags: fpu\n").cpus is None
    _refused(parse_lscpu, "CPU(s): 4\n: 4\n", "not `Key: value`", 2, ": 4", "lscpu")


def test_meminfo_whole(synth) -> None:
    m = parse_meminfo("MemTotal:       2113389168 kB\nActive(anon):     101436 kB\n"
                      "HugePages_Total:       8\n")
    assert m.model_dump() == {"mem_total_kb": 2113389168, "mem_available_kb": None,
                              "values": {"MemTotal": 2113389168, "Active(anon)": 101436,
                                         "HugePages_Total": 8}}
    assert parse_meminfo(synth("meminfo_dgx-a100.txt")).values["Active(anon)"] == 101436
    _refused(parse_meminfo, "MemFree: 1 kB\n", "no MemTotal line", None, None, "meminfo")
    _refused(parse_meminfo, "MemTotal: 1 kB\nMemFree: lots\n", "not `Key: N kB`", 2,
             "MemFree: lots", "meminfo")


def test_df_whole_rows_and_units(real, synth) -> None:
    assert parse_df(real("df.txt")).model_dump() == {"rounded": True, "entries": [
        {"filesystem": "/dev/vda", "fstype": "ext4", "size_bytes": 252 << 30,
         "used_bytes": 17 << 30, "avail_bytes": 128 << 30, "mount": "/"}] * 2}
    posix = parse_df(synth("df-PT_work-ckpt.txt"))
    assert posix.model_dump()["entries"][1] == {
        "filesystem": "10.128.0.12:/export/ckpt", "fstype": "nfs4",
        "size_bytes": 10737418240 << 10, "used_bytes": 5368709120 << 10,
        "avail_bytes": 5368709120 << 10, "mount": "/mnt/ckpt"}
    wrapped = parse_df(synth("df-hT_wrapped.txt"))
    assert [(e.filesystem, e.size_bytes, e.used_bytes, e.avail_bytes) for e in wrapped.entries] == [
        ("/dev/mapper/ubuntu--vg-ubuntu--lv--with--a--long--name", round(1.8 * (1 << 40)),
         412 << 30, round(1.3 * (1 << 40))),
        ("/dev/nvme1n1", round(3.5 * (1 << 40)), round(1.2 * (1 << 40)), round(2.3 * (1 << 40)))]
    mega = parse_df("Filesystem Type 1M-blocks Used Available Use% Mounted on\n"
                    "/dev/md0 xfs 100 40 60 40% /data set\n")
    assert mega.model_dump()["entries"] == [{
        "filesystem": "/dev/md0", "fstype": "xfs", "size_bytes": 100 << 20, "used_bytes": 40 << 20,
        "avail_bytes": 60 << 20, "mount": "/data set"}]
    assert mega.rounded is False
    units = parse_df("Filesystem Type Size Used Avail Use% Mounted on\n"
                     "tank zfs 2P 512K 7 1% /tank\n").entries[0]
    assert (units.size_bytes, units.used_bytes, units.avail_bytes) == (2 << 50, 512 << 10, 7)
    assert units.fstype == "zfs" and parse_df(real("df.txt")).fstype_of("/") == "ext4"


def test_df_refusals() -> None:
    hdr = "Filesystem Type 1024-blocks Used Available Capacity Mounted on"
    for bad in ("Filesystem Size Used Avail Use% Mounted on", "Filesystem Type 1024-blocks",
                "Filesystem Type blocks Used Available Capacity Mounted on",
                "Filesystem Type 1X-blocks Used Available Capacity Mounted on",
                "FS Type Size Used Avail Use% Mounted on"):
        _refused(parse_df, bad + "\n", "not a `df -PT`/`df -hT` header", 1, bad, "df")
    _refused(parse_df, hdr + "\n/dev/sda1 ext4 10 5 5 50%\n", "not a df row", 2,
             "/dev/sda1 ext4 10 5 5 50%", "df")
    _refused(parse_df, "Filesystem Type Size Used Avail Use% Mounted on\n/dev/sda1 ext4 1Q 5 5 50% /\n",
             "not a df row", 2, "/dev/sda1 ext4 1Q 5 5 50% /", "df")
    # a wrapped name whose row never comes
    _refused(parse_df, hdr + "\n/dev/mapper/long\n", "not a df row", 2, "/dev/mapper/long", "df")


def test_df_longest_mount_wins(synth) -> None:
    facts = parse_df("Filesystem Type 1024-blocks Used Available Capacity Mounted on\n"
                     "a ext4 1 1 1 1% /\nb nfs4 1 1 1 1% /mnt\nc xfs 1 1 1 1% /mnt/ckpt\n")
    assert [facts.fstype_of(p) for p in ("/mnt/ckpt/run", "/mnt/ckpt", "/mnt/x", "/mntx", "/")] == [
        "xfs", "xfs", "nfs4", "ext4", "ext4"]
    assert parse_df("Filesystem Type 1024-blocks Used Available Capacity Mounted on\n"
                    "b nfs4 1 1 1 1% /mnt\n").fstype_of("/home") is None
    # only the trailing `/` is ignored: a folder beside `/mnt/BOX` is not in it
    box = parse_df("Filesystem Type 1024-blocks Used Available Capacity Mounted on\n"
                   "a ext4 1 1 1 1% /\nb nfs4 1 1 1 1% /mnt/BOX\n")
    assert (box.fstype_of("/mnt/BOX/a"), box.fstype_of("/mnt/BO/a")) == ("nfs4", "ext4")


def test_mpirun_refused_names_the_first_line() -> None:
    _refused(parse_mpirun_version, "\nbash: mpirun: command not found\nmore\n",
             "not an Open MPI, MPICH or Intel MPI version banner", 2,
             "bash: mpirun: command not found", "mpirun-version")
    # MPICH says "Version:" only inside its HYDRA block
    _refused(parse_mpirun_version, "Version:  4.0.2\n",
             "not an Open MPI, MPICH or Intel MPI version banner", 1, "Version:  4.0.2",
             "mpirun-version")
    assert parse_mpirun_version("prterun (Open MPI) 5.0.0rc2\n").version == "5.0.0rc2"
