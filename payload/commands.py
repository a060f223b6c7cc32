"""The fixed list of commands `python3 -m payload collect` runs on a node.

Shared by the payload (which runs them) and the controller (which parses
them by id), so the two can never disagree about what a key means.
Standard library only, Python 3.8 compatible.
"""

from typing import Dict, List, NamedTuple, Optional


class Command(NamedTuple):
    id: str
    # argv as a list; "{work_dir}" / "{ckpt_dir}" / "{python}" are filled in by the payload.
    argv: List[str]
    # parser kind on the controller side (None: kept as evidence only)
    parser: Optional[str]
    timeout_s: float = 30.0


# nvidia-smi --query-gpu fields. Drivers before ~535 call the throttle field
# clocks_throttle_reasons.active; an unknown field fails the whole query, so the
# payload retries with QUERY_GPU_FIELDS_OLD when the first form is refused. `serial`
# (the board's serial number, which `gpuvet history` and `gpuvet claim` name a card by)
# is left out of the retry: `nvidia-smi -q -x` carries it too.
QUERY_GPU_FIELDS = [
    "index", "name", "uuid", "pci.bus_id", "pci.device_id", "memory.total", "memory.used",
    "power.limit", "power.max_limit", "enforced.power.limit", "driver_version",
    "vbios_version", "pcie.link.gen.current", "pcie.link.gen.max",
    "pcie.link.width.current", "pcie.link.width.max", "temperature.gpu",
    "clocks.sm", "clocks.max.sm", "clocks.mem", "clocks_event_reasons.active",
    "ecc.mode.current", "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.uncorrected.aggregate.total", "retired_pages.pending",
    "mig.mode.current", "compute_mode", "serial",
]
QUERY_GPU_FIELDS_OLD = [
    "clocks_throttle_reasons.active" if f == "clocks_event_reasons.active" else f
    for f in QUERY_GPU_FIELDS if f != "serial"
]


def query_gpu_argv(fields: List[str]) -> List[str]:
    return ["nvidia-smi", "--query-gpu=" + ",".join(fields), "--format=csv"]


COMMANDS: List[Command] = [
    Command("date", ["date", "-Iseconds"], None),
    Command("uname", ["uname", "-a"], "uname"),
    Command("os_release", ["cat", "/etc/os-release"], "os-release"),
    Command("nvidia_smi", ["nvidia-smi"], "nvidia-smi-table"),
    Command("nvidia_smi_version", ["nvidia-smi", "--version"], None),
    Command("nvidia_smi_L", ["nvidia-smi", "-L"], "nvidia-smi-L"),
    Command("nvidia_smi_q_xml", ["nvidia-smi", "-q", "-x"], "nvidia-smi-q-xml", 60.0),
    Command("query_gpu", query_gpu_argv(QUERY_GPU_FIELDS), "nvidia-smi-query-gpu"),
    # the processes on every GPU with their memory (the table truncates a wide cell)
    Command("compute_apps", ["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,process_name,"
                             "used_memory", "--format=csv"], "nvidia-smi-compute-apps"),
    Command("topo_m", ["nvidia-smi", "topo", "-m"], "topo-m"),
    Command("topo_p2p_n", ["nvidia-smi", "topo", "-p2p", "n"], "topo-p2p"),
    Command("nvlink_s", ["nvidia-smi", "nvlink", "-s"], "nvlink-s"),
    Command("nvcc_version", ["{nvcc}", "--version"], "nvcc-version"),
    Command("ldconfig", ["ldconfig", "-p"], "ldconfig-nccl"),
    Command("torch", ["{python}", "-c", "{torch_probe}"], "torch-info", 180.0),
    Command("ibv_devinfo", ["ibv_devinfo"], "ibv-devinfo"),
    Command("ibstat", ["ibstat"], "ibstat"),
    Command("ip_addr", ["ip", "-br", "addr"], None),
    Command("lscpu", ["lscpu"], "lscpu"),
    Command("meminfo", ["cat", "/proc/meminfo"], "meminfo"),
    Command("df", ["df", "-PT", "{work_dir}", "{ckpt_dir}"], "df"),
    Command("mounts", ["cat", "/proc/mounts"], None),
    Command("mpirun_version", ["mpirun", "--version"], "mpirun-version"),
]

COMMANDS_BY_ID: Dict[str, Command] = {c.id: c for c in COMMANDS}

# What PyTorch sees, run with the node's python. Prints one JSON line; the
# same shape as shared fixture torch-info.txt. A CPU-only build (its version.py says
# neither CUDA nor ROCm) sees no GPU whatever the node has: that is read from the file,
# without importing torch (2-5 s of a preflight); any other build, or a version.py that
# does not say, is imported and asked.
TORCH_PROBE = (
    "import importlib.util,json,os\n"
    "d=None\n"
    "s=importlib.util.find_spec('torch')\n"
    "if s is not None and s.submodule_search_locations:\n"
    "    v={}\n"
    "    try:\n"
    "        with open(os.path.join(list(s.submodule_search_locations)[0],'version.py')) as f:\n"
    "            exec(f.read(),v)\n"
    "    except Exception:\n"
    "        v={}\n"
    "    if isinstance(v.get('__version__'),str) and v.get('cuda',1) is None "
    "and v.get('hip',1) is None:\n"
    "        d={'torch':v['__version__'],'cuda':None,'nccl':None,'available':False,"
    "'count':0,'devices':[]}\n"
    "if d is None:\n"
    "    import torch\n"
    "    d={'torch':torch.__version__,'cuda':torch.version.cuda,'nccl':None,"
    "'available':torch.cuda.is_available(),'count':0,'devices':[]}\n"
    "    try:\n"
    "        d['nccl']='.'.join(map(str,torch.cuda.nccl.version()))\n"
    "    except Exception:\n"
    "        pass\n"
    "    if d['available']:\n"
    "        d['count']=torch.cuda.device_count()\n"
    "        for i in range(d['count']):\n"
    "            p=torch.cuda.get_device_properties(i)\n"
    "            d['devices'].append({'index':i,'name':torch.cuda.get_device_name(i),"
    "'memory_bytes':p.total_memory,'cc':list(torch.cuda.get_device_capability(i))})\n"
    "print(json.dumps(d))\n"
)
