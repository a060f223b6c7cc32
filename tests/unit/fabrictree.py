"""sysfs InfiniBand trees for the fabric tests, built from a real capture.

The base is gpud's copy of `/sys/class/infiniband` on an H100 node with eight 400G NDR
InfiniBand ports and one RoCE bond (tests/fixtures/public/sysfs-infiniband_h100-8x-ndr_gpud,
byte for byte); a test copies it and changes what its case needs (a counter after a load,
a P_Key table, a RoCE port's GID table), as the kernel would show it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from orchestrator.parsers.fabric import FabricFacts, parse_fabric
from payload.fabric import snapshot

H100 = (Path(__file__).resolve().parents[1] / "fixtures" / "public"
        / "sysfs-infiniband_h100-8x-ndr_gpud")
IB_PORTS = ("mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9")


def tree(tmp: Path, name: str = "ib") -> Path:
    """A copy of the H100 node's tree to change."""
    dest = tmp / name
    shutil.copytree(H100, dest)
    return dest


def port_dir(root: Path, dev: str, port: int = 1) -> Path:
    return root / dev / "ports" / str(port)


def set_counter(root: Path, dev: str, counter: str, value: int, port: int = 1) -> None:
    (port_dir(root, dev, port) / "counters" / counter).write_text(f"{value}\n")


def counter(root: Path, dev: str, counter: str, port: int = 1) -> int:
    return int((port_dir(root, dev, port) / "counters" / counter).read_text())


def set_pkeys(root: Path, keys: list[str], devs: tuple[str, ...] = IB_PORTS,
              size: int = 16) -> None:
    """A P_Key table as mlx5 shows it (128 entries there, 16 here), unused ones 0x0000."""
    for dev in devs:
        d = port_dir(root, dev) / "pkeys"
        d.mkdir(exist_ok=True)
        for i in range(size):
            (d / str(i)).write_text((keys[i] if i < len(keys) else "0x0000") + "\n")


def set_gids(root: Path, net: Path, dev: str, entries: list[tuple[str, str]],
             netdev: str = "bond0", mtu: int = 9000, size: int = 16) -> None:
    """A RoCE port's GID table: populated entries (gid, type) first, then zero GIDs whose
    type file cannot be read (the kernel answers EINVAL: here the file is absent)."""
    p = port_dir(root, dev)
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (p / sub).mkdir(parents=True, exist_ok=True)
    for i in range(size):
        if i < len(entries):
            gid, kind = entries[i]
            (p / "gids" / str(i)).write_text(gid + "\n")
            (p / "gid_attrs" / "types" / str(i)).write_text(kind + "\n")
            (p / "gid_attrs" / "ndevs" / str(i)).write_text(netdev + "\n")
        else:
            (p / "gids" / str(i)).write_text("0000:0000:0000:0000:0000:0000:0000:0000\n")
    (net / netdev).mkdir(parents=True, exist_ok=True)
    (net / netdev / "mtu").write_text(f"{mtu}\n")


def snap(root: Path, net: Path | None = None) -> dict[str, Any]:
    return snapshot(str(root), str(net or root.parent / "no-net"))


def facts(root: Path, net: Path | None = None) -> FabricFacts:
    """What the controller reads from the payload's snapshot of `root`."""
    return parse_fabric(json.dumps(snap(root, net)))
