"""known_hosts for the SSH executor: tolerant loading, OpenSSH fingerprints, the policy.

Paramiko's own loader stops at the first line whose key is not valid base64
(InvalidHostKey), so one damaged line would block every host. Here each line is
read on its own: a bad one is skipped and remembered with its file and line
number, and named in the error of a host that then turns out unknown (the bad
line may have been its entry). `@revoked` lines are honoured: a revoked key is
refused even with --accept-new-host-keys. `@cert-authority` lines are skipped
(host certificates are not supported) and named the same way.
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
from paramiko.hostkeys import HostKeyEntry

from orchestrator.errors import HostKeyError
from orchestrator.files import open_regular

_write_lock = threading.Lock()


def fingerprint(key: paramiko.PKey) -> str:
    """SHA256:... as OpenSSH prints it (base64 without padding)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


@dataclass
class KnownHosts:
    path: Path
    entries: list[tuple[str, paramiko.PKey]] = field(default_factory=list)  # (host pattern, key)
    revoked: set[bytes] = field(default_factory=set)  # key blobs
    problems: list[str] = field(default_factory=list)  # "FILE:LINE: why"

    def note(self) -> str:
        """A sentence for errors about a host not found: the lines that were skipped."""
        if not self.problems:
            return ""
        shown = "; ".join(self.problems[:3])
        more = f" (and {len(self.problems) - 3} more)" if len(self.problems) > 3 else ""
        return f"; lines skipped as unreadable: {shown}{more}"


def load(path: Path) -> KnownHosts:
    kh = KnownHosts(path)
    if not path.is_file():
        return kh
    try:  # opened without blocking: a FIFO put in its place since `inventory check` is named
        fd = open_regular(path)
    except OSError as exc:
        kh.problems.append(f"{path}: cannot read it: {exc.strerror or exc}")
        return kh
    with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            where = f"{path}:{lineno}"
            marker = None
            if line.startswith("@"):
                marker, _, line = line.partition(" ")
                line = line.strip()
                if marker not in ("@revoked", "@cert-authority"):
                    kh.problems.append(f"{where}: unknown marker {marker}")
                    continue
            try:
                entry = HostKeyEntry.from_line(line, lineno)
            except Exception as exc:  # InvalidHostKey, UnknownKeyType, bad key data
                kh.problems.append(f"{where}: {type(exc).__name__}")
                continue
            if entry is None or entry.key is None:
                kh.problems.append(f"{where}: not a known_hosts line")
                continue
            if marker == "@revoked":
                kh.revoked.add(entry.key.asbytes())
            elif marker == "@cert-authority":
                kh.problems.append(f"{where}: @cert-authority is not supported")
            else:
                kh.entries += [(name, entry.key) for name in entry.hostnames]
    return kh


def revoked_error(kh: KnownHosts, hostname: str, key: paramiko.PKey, node: str) -> HostKeyError:
    return HostKeyError(
        f"host key of {hostname} ({key.get_name()} {fingerprint(key)}) is marked @revoked "
        f"in {kh.path}; connection refused", node=node,
        hint="this key must not be trusted: ask the provider for the node's current key")


class Policy(paramiko.MissingHostKeyPolicy):
    """Reject unknown keys, or accept and record them when asked to (accept-new)."""

    def __init__(self, kh: KnownHosts, accept_new: bool, node: str) -> None:
        self.kh = kh
        self.accept_new = accept_new
        self.node = node
        self.accepted: list[str] = []

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if key.asbytes() in self.kh.revoked:
            raise revoked_error(self.kh, hostname, key, self.node)
        if not self.accept_new:
            raise HostKeyError(
                f"host key of {hostname} is not in {self.kh.path} "
                f"({key.get_name()} {fingerprint(key)}){self.kh.note()}",
                node=self.node,
                hint=("verify the fingerprint with the provider, then add it "
                      f"(ssh-keygen -F / ssh-keyscan -p PORT HOST >> {self.kh.path}) "
                      "or rerun with --accept-new-host-keys"))
        with _write_lock:
            self.kh.path.parent.mkdir(parents=True, exist_ok=True)
            with self.kh.path.open("a", encoding="utf-8") as f:
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
            os.chmod(self.kh.path, 0o600)
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.accepted.append(hostname)


def changed_error(exc: paramiko.BadHostKeyException, kh: KnownHosts, node: str) -> HostKeyError:
    """Both fingerprints, as OpenSSH shows them, and the one way to fix it."""
    return HostKeyError(
        f"host key of {exc.hostname} CHANGED: {kh.path} has {exc.expected_key.get_name()} "
        f"{fingerprint(exc.expected_key)}, the host offers {exc.key.get_name()} "
        f"{fingerprint(exc.key)}; connection refused",
        node=node,
        hint=("this can mean a reinstalled node or an attack; confirm the new fingerprint "
              f"with the provider, then remove the old key: ssh-keygen -R {exc.hostname} "
              f"-f {kh.path}"))
