"""Why an SSH hop failed, in one word and one sentence.

A node may sit behind a jump host. When a connection fails the user needs to
know which hop broke (the jump host, or the node behind it) and why: refused
(nothing listens), timed out (dropped by a firewall, or down), DNS (the name
does not resolve), auth (the key or user is wrong). Paramiko's exceptions say
this in many shapes (NoValidConnectionsError wrapping one error per address,
socket.gaierror, a ChannelException carrying the jump host's words); they are
read here once, so the message states the cause once.
"""

from __future__ import annotations

import errno
import logging
import re
import socket
import threading
from dataclasses import dataclass

import paramiko
from paramiko.ssh_exception import NoValidConnectionsError

from orchestrator.errors import NodeUnreachable


@dataclass(frozen=True)
class Hop:
    """One SSH hop as the inventory names it."""

    name: str  # the jump host's or node's name
    kind: str  # "jump host" or "node"
    host: str
    port: int


_ERRNO_CAUSE = {
    errno.ECONNREFUSED: "refused",
    errno.ETIMEDOUT: "timed out",
    errno.EHOSTUNREACH: "unreachable",
    errno.ENETUNREACH: "unreachable",
    errno.ECONNRESET: "closed",
}

# words a jump host's sshd uses when it cannot open the forwarded connection
_CHANNEL_WORDS = [
    ("refused", "refused"), ("timed out", "timed out"), ("name or service not known", "dns"),
    ("temporary failure in name resolution", "dns"), ("no address associated", "dns"),
    ("no route to host", "unreachable"), ("network is unreachable", "unreachable"),
    ("administratively prohibited", "forbidden"),
]

_PHRASE = {
    "refused": "connection refused",
    "timed out": "timed out",
    "dns": "the name does not resolve (DNS)",
    "auth": "authentication failed",
    "unreachable": "no route to the host",
    "closed": "the connection was closed by the other side",
    "banner": "no SSH greeting (not an SSH server, or overloaded)",
    "forbidden": "the jump host does not allow forwarding to it",
    "ssh": "SSH error",
}


def cause_of(exc: BaseException) -> tuple[str, str]:
    """(cause word, detail) for a connection error; detail is '' when the word says it all."""
    if isinstance(exc, paramiko.AuthenticationException):
        return "auth", str(exc).rstrip(".")
    if isinstance(exc, socket.gaierror):
        return "dns", exc.strerror or ""
    if isinstance(exc, NoValidConnectionsError):
        errs = list(exc.errors.values())
        first = errs[0] if errs else exc
        return _ERRNO_CAUSE.get(getattr(first, "errno", None) or -1, "refused"), ""
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "timed out", ""
    if isinstance(exc, paramiko.ChannelException):
        text = (exc.text or "").lower()
        for words, cause in _CHANNEL_WORDS:
            if words in text:
                return cause, ""
        return "ssh", exc.text or f"channel open failed (code {exc.code})"
    if isinstance(exc, OSError) and exc.errno in _ERRNO_CAUSE:
        return _ERRNO_CAUSE[exc.errno], ""
    if isinstance(exc, EOFError):
        return "closed", ""
    text = str(exc)
    if isinstance(exc, paramiko.SSHException):
        low = text.lower()
        if "protocol banner" in low:
            return "banner", ""
        if "timeout opening channel" in low or "timed out" in low:
            return "timed out", ""
        if "reset" in low or "eof" in low:
            return "closed", ""
    return "ssh", text or type(exc).__name__


class ChannelFailures(logging.Handler):
    """Keeps the reason a jump host gave for refusing to open a forwarded connection.

    Paramiko raises ChannelException with only a generic text for the failure code
    ("Connect failed") and logs the jump host's own words ("Connection refused",
    "No route to host"): they are taken from that log record.
    """

    _PATTERN = re.compile(r"open FAILED: (.*): [^:]*$")

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self._lock = threading.Lock()
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        m = self._PATTERN.search(record.getMessage())
        if m:
            with self._lock:
                self.last = m.group(1)

    def take(self) -> str | None:
        with self._lock:
            reason, self.last = self.last, None
        return reason


_channels: dict[str, ChannelFailures] = {}
_channels_lock = threading.Lock()


def channel_failures(log_channel: str) -> ChannelFailures:
    """The handler on a transport's own log channel (one per name, made once)."""
    with _channels_lock:
        handler = _channels.get(log_channel)
        if handler is None:
            handler = _channels[log_channel] = ChannelFailures()
            logging.getLogger(log_channel).addHandler(handler)
        return handler


def with_reason(exc: BaseException, reason: str | None) -> BaseException:
    """The ChannelException again, with the jump host's own words as its text."""
    if reason and isinstance(exc, paramiko.ChannelException):
        return paramiko.ChannelException(exc.code, reason)
    return exc


def _hint(cause: str, hop: Hop, timeout: float) -> str:
    where = f"{hop.host}:{hop.port}"
    return {
        "refused": f"check that sshd runs on {hop.name} and listens on {where}",
        "timed out": (f"check that {hop.name} is up and {where} is open to you (firewall, "
                      f"security group); connect_timeout_s is {timeout:g}"),
        "dns": f"check the host name {hop.host!r} of {hop.name} (or give its IP address)",
        "auth": f"check user and identity_file of {hop.name} in the inventory",
        "unreachable": f"check the network path to {where}",
        "forbidden": "allow TCP forwarding on the jump host (AllowTcpForwarding)",
    }.get(cause, f"check that {hop.name} is up and reachable on {where}")


def unreachable(exc: BaseException, hop: Hop, *, node: str, via: Hop | None = None,
                timeout: float) -> NodeUnreachable:
    """The one error for a failed hop: which hop, through what, and why."""
    cause, detail = cause_of(exc)
    what = f"jump host {hop.name}" if hop.kind == "jump host" else hop.name
    route = f" through jump host {via.name}" if via else ""
    toward = f" on the way to {node}" if hop.kind == "jump host" else ""
    phrase = _PHRASE.get(cause, cause)
    if cause == "timed out":
        phrase = f"timed out after {timeout:g} s"
    if detail and cause == "ssh":
        phrase = detail
    elif detail:
        phrase += f" ({detail})"
    return NodeUnreachable(
        f"cannot connect to {what} ({hop.host}:{hop.port}){route}{toward}: {phrase}",
        hop=hop.name, cause=cause, node=node, hint=_hint(cause, hop, timeout))
