"""Keep secrets out of what gpuvet stores.

Used on the node (environment variables, command output) and by the
controller (for example the ``env`` list nccl-tests writes into its JSON).
Standard library only, Python 3.8 compatible.

Public API:

- ``is_secret_name(name)``: does a variable name look like it holds a secret?
- ``redact_value(name, value)``: the value as it may be stored.
- ``scrub_env(mapping)``: a new dict with every value passed through
  ``redact_value`` (secret names keep their key, the value becomes ``***``).
- ``scrub_env_list(["K=V", ...])``: the same for a list of ``K=V`` strings.
- ``scrub_text(text)``: free text with URL passwords, ``NAME=value`` pairs
  whose name looks secret and well-known token shapes replaced by ``***``.
- ``scrub_lines(text)``: ``scrub_text`` that keeps the number of lines (a
  file whose line numbers are quoted, such as an inventory copy).
- ``scrub_doc(obj)``: a JSON-like document (a suite, a run's source, a
  supervisor's report) with every string scrubbed and the values of
  secret-looking keys replaced.

Names are read in parts: ``_``-separated and camelCase words, so the keys of
connection strings (``AccountKey=``, ``SharedAccessKey=``, ``Password=``) and
of query strings (``sig=``, ``token=``, ``X-Amz-Signature=``) are secret
wherever such a string appears.
"""

import re
from typing import Any, Dict, Iterable, List, Mapping, Optional

REDACTED = "***"

# Name parts (the name upper-cased and split on anything not a letter or a
# digit) that mark a secret when they are the whole part ...
_SECRET_PARTS_EXACT = frozenset(
    [
        "KEY",
        "KEYS",
        "PASS",
        "PW",
        "AUTH",
        "OAUTH",
        "SESSION",
        "DSN",
        "WEBHOOK",
        "SIGNATURE",
        "OTP",
        "SALT",
        "SIG",  # an Azure SAS token's signature (sig=...)
    ]
)
# ... or anywhere inside a part (GITHUBTOKEN, CLIENTSECRET, DBPASSWORD).
_SECRET_PARTS_SUBSTR = (
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "APIKEY",
    "ACCESSKEY",
    "SECRETKEY",
    "PRIVATEKEY",
    "SSHKEY",
    "PRIVATE",
    "CREDENTIAL",
    "COOKIE",
)
# Adjacent part pairs: ACCESS_KEY, API_KEY, PRIVATE_KEY are covered by KEY.
# Names that are secret although no part says so.
_SECRET_NAMES = frozenset(
    [
        # Open MPI's per-job PSM/OFI authentication key.
        "OMPI_MCA_ORTE_PRECONDITION_TRANSPORTS",
        "OMPI_MCA_ORTE_PRECONDITION_TRANSPORTS_KEY",
    ]
)

# Variables whose values are paths or device lists: the long-blob heuristic is
# not applied to them (hashes in store paths, GPU UUIDs), the other rules are.
_BLOB_EXEMPT_NAMES = frozenset(
    [
        "PATH",
        "LD_LIBRARY_PATH",
        "LIBRARY_PATH",
        "CPATH",
        "PYTHONPATH",
        "MANPATH",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "PWD",
        "OLDPWD",
        "HOME",
    ]
)
_BLOB_EXEMPT_SUFFIXES = ("_PATH", "_HOME", "_DIR", "_ROOT", "_PREFIX", "_FILE", "_VISIBLE_DEVICES")

_SPLIT_RE = re.compile(r"[^A-Z0-9]+")
_CAMEL_RE = re.compile(r"([a-z0-9])(?=[A-Z])")


def is_secret_name(name: str) -> bool:
    """True when a variable name looks like it holds a secret.

    Works on the ``_``-separated parts of the name, so NCCL_IB_PKEY (part
    PKEY) and XDG_..._KEYBOARD are not secrets while AWS_ACCESS_KEY_ID,
    HF_TOKEN, DB_PASSWORD and GITHUB_APIKEY are; camelCase words are parts too
    (AccountKey, SharedAccessKey: the keys of a storage connection string).
    """
    if name.upper() in _SECRET_NAMES:
        return True
    upper = _CAMEL_RE.sub("\\1_", name).upper()
    for part in _SPLIT_RE.split(upper):
        if not part:
            continue
        if part in _SECRET_PARTS_EXACT:
            return True
        for word in _SECRET_PARTS_SUBSTR:
            if word in part:
                return True
    return False


# scheme://user:password@host -> scheme://user:***@host
_URL_PASSWORD_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@]*:)([^/\s@]+)(@)")
# scheme://TOKEN@host (a token as the user name, as git hosts take one) -> scheme://***@host;
# a user name of fewer than 20 characters stays
_URL_TOKEN_USER_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)([^/\s:@]{20,})(@)")

# Well-known token shapes.
_TOKEN_RES = [
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),  # GitHub
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"),
    re.compile(r"\bglpat-[A-Za-z0-9_\-]{20,}"),  # GitLab
    re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[0-9A-Z]{16}\b"),  # AWS key id
    re.compile(r"\bhf_[A-Za-z0-9]{20,}"),  # Hugging Face
    re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}"),  # Slack
    re.compile(r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_\-]{20,}"),  # OpenAI / Anthropic
    re.compile(r"\bAIza[0-9A-Za-z_\-]{35}"),  # Google API key
    re.compile(r"\bya29\.[0-9A-Za-z_\-]{20,}"),  # Google OAuth access token
    re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),  # JWT
    re.compile(r"\bnpm_[A-Za-z0-9]{30,}"),
    re.compile(r"\bpypi-[A-Za-z0-9_\-]{30,}"),
    re.compile(r"\bwandb_v1_[A-Za-z0-9_\-]{20,}"),
]
_BEARER_RE = re.compile(r"(?i)\b(bearer\s+|authorization:\s*basic\s+)([A-Za-z0-9._~+/\-]{16,}=*)")
_PEM_BLOCK_RE = re.compile(
    r"-----BEGIN ([A-Z0-9 ]*PRIVATE KEY[A-Z0-9 ]*)-----.*?(?:-----END [A-Z0-9 ]*-----|\Z)",
    re.DOTALL,
)
# NAME=value pairs in free text (env dumps, mount options, query strings);
# the value may be quoted.
_ASSIGN_RE = re.compile(
    r"([A-Za-z_][A-Za-z0-9_.\-]*)=(\"[^\"\n]*\"|'[^'\n]*'|[^\s&;,'\"]+)"
)

# Long base64/base64url/hex runs (used on values of unlisted variables only).
_BLOB_RE = re.compile(r"[A-Za-z0-9+/=_\-]{32,}")
_UUID_RE = re.compile(
    r"^(?:GPU-|MIG-)?[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
_HEX_RE = re.compile(r"^[0-9a-fA-F]+$")


def _assign_sub(m: "re.Match[str]") -> str:
    if not is_secret_name(m.group(1)):
        return m.group(0)
    value = m.group(2)
    quote = value[0] if value[:1] in ("'", '"') else ""
    return m.group(1) + "=" + quote + REDACTED + quote


def scrub_text(text: str) -> str:
    """Free text with secrets replaced by ``***``.

    Redacts URL passwords (keeping the user) and tokens given as a URL's user,
    ``NAME=value`` pairs whose name (connection strings' and query strings' keys too)
    looks secret, ``Bearer <token>``, private-key PEM blocks and well-known
    token shapes (GitHub, GitLab, AWS key ids, Hugging Face, Slack, OpenAI,
    Google, JWT, npm, PyPI, W&B). Everything else is left as it is, so the
    output of nvidia-smi and friends still parses.
    """
    if not text:
        return text
    if "-----BEGIN" in text:
        text = _PEM_BLOCK_RE.sub("-----BEGIN \\1-----" + REDACTED + "-----END \\1-----", text)
    if "://" in text:
        text = _URL_PASSWORD_RE.sub("\\1" + REDACTED + "\\3", text)
        text = _URL_TOKEN_USER_RE.sub("\\1" + REDACTED + "\\3", text)
    if "=" in text:
        text = _ASSIGN_RE.sub(_assign_sub, text)
    text = _BEARER_RE.sub("\\1" + REDACTED, text)
    for rx in _TOKEN_RES:
        text = rx.sub(REDACTED, text)
    return text


def _blob_exempt(name: str) -> bool:
    upper = name.upper()
    return upper in _BLOB_EXEMPT_NAMES or upper.endswith(_BLOB_EXEMPT_SUFFIXES)


def _looks_like_blob(run: str) -> bool:
    core = run.strip("=-_/")
    if len(core) < 32:
        return False
    if _UUID_RE.match(core):
        return False
    if run.startswith("/"):
        # an absolute path such as /opt/nvidia/hpc_sdk/Linux_x86_64/24
        return False
    has_digit = any(c.isdigit() for c in core)
    has_upper = any(c.isupper() for c in core)
    has_lower = any(c.islower() for c in core)
    if _HEX_RE.match(core):
        return has_digit and (has_upper or has_lower)
    return has_digit and has_upper and has_lower


def _redact_blobs(value: str) -> str:
    def sub(m: "re.Match[str]") -> str:
        return REDACTED if _looks_like_blob(m.group(0)) else m.group(0)

    return _BLOB_RE.sub(sub, value)


def redact_value(name: str, value: Optional[str]) -> Optional[str]:
    """The value of variable ``name`` as it may be stored.

    ``***`` when the name looks secret or the value holds a PEM block; else
    the value with URL passwords and token shapes redacted and, unless the
    variable is a known path/device-list variable, long base64/hex runs
    (32+ characters, mixed letters and digits) replaced by ``***``.
    """
    if value is None:
        return None
    if is_secret_name(name):
        return REDACTED
    if "-----BEGIN" in value:
        return REDACTED
    value = scrub_text(value)
    if not _blob_exempt(name):
        value = _redact_blobs(value)
    return value


def scrub_env(mapping: Mapping[str, str]) -> Dict[str, str]:
    """A copy of ``mapping`` with every value passed through ``redact_value``.

    Secret-looking names are kept (so one can see the variable was set) with
    the value ``***``.
    """
    out: Dict[str, str] = {}
    for name in mapping:
        value = redact_value(name, mapping[name])
        out[name] = REDACTED if value is None else value
    return out


def scrub_env_list(items: Iterable[str]) -> List[str]:
    """``scrub_env`` for a list of ``"NAME=value"`` strings (order kept).

    Items without ``=`` go through ``scrub_text``.
    """
    out: List[str] = []
    for item in items:
        if not isinstance(item, str):
            out.append(item)
            continue
        name, sep, value = item.partition("=")
        if not sep:
            out.append(scrub_text(item))
            continue
        redacted = redact_value(name, value)
        out.append(name + "=" + (REDACTED if redacted is None else redacted))
    return out


# YAML `NAME: value` pairs (block or flow style), for scrub_lines
_YAML_PAIR_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_.\-]*)(\s*:[ \t]+)(\"[^\"\n]*\"|'[^'\n]*'|"
                           r"[^\s,{}\[\]#][^,}\]#\n]*)")


def _yaml_pair_sub(m: "re.Match[str]") -> str:
    if not is_secret_name(m.group(1)) or m.group(3).strip().strip("'\"") in ("null", "~", REDACTED):
        return m.group(0)
    return m.group(1) + m.group(2) + REDACTED


def scrub_lines(text: str, yaml_pairs: bool = False) -> str:
    """``scrub_text`` without changing the number of lines, for a file kept as written
    (an inventory copy): a private-key block becomes ``***`` followed by as many line
    breaks as it held. With ``yaml_pairs`` (a YAML text that could not be read as data)
    a ``NAME: value`` pair whose name looks secret also keeps its name only."""
    if "-----BEGIN" in text:
        text = _PEM_BLOCK_RE.sub(lambda m: REDACTED + "\n" * m.group(0).count("\n"), text)
    return "".join(scrub_text(_YAML_PAIR_RE.sub(_yaml_pair_sub, line) if yaml_pairs else line)
                   for line in text.splitlines(True))


def scrub_doc(obj: Any) -> Any:
    """A copy of a JSON-like document fit to store: every string through ``scrub_text``,
    the string value of a key whose name looks secret replaced by ``***`` (keys are kept;
    numbers, such as ``tokens_per_s``, stay)."""
    if isinstance(obj, str):
        return scrub_text(obj)
    if isinstance(obj, dict):
        return {k: (REDACTED if isinstance(v, str) and v and isinstance(k, str)
                    and is_secret_name(k) else scrub_doc(v)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub_doc(v) for v in obj]
    return obj
