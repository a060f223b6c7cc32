"""What a secret looks like: which names hold one (read in parts, ``_``-separated and
camelCase words), which of their values are harmless all the same (the allow list), the
token shapes of well-known services and the long mixed-case blobs. `payload/scrub.py`
finds where secrets stand in text (pairs, flags, URLs, headers, key blocks) and uses these
to decide; docs/reliability.md lists each form and each rule. Standard library only,
Python 3.8 compatible.
"""

import re
from typing import List

REDACTED = "***"

# Name parts (the name upper-cased and split on anything not a letter or a
# digit) that mark a secret when they are the whole part ...
_SECRET_PARTS_EXACT = frozenset(
    [
        "KEY",
        "KEYS",
        "PASS",
        "PW",
        "PWD",  # MYSQL_PWD; PWD alone (the working directory) is a name of its own
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
    "SSHPASS",
)
# Parts that hold a secret word but name something else: a tokenizer is no token.
_NOT_SECRET_PARTS = frozenset(["TOKENIZER", "TOKENIZERS"])
# KEY after these words is a lookup key or a public one (CACHE_KEY, unit_key, HOST_KEY).
_LOOKUP_KEY_WORDS = frozenset(["CACHE", "UNIT", "SORT", "PRIMARY", "PARTITION", "FOREIGN",
                               "ROUTING", "GROUP", "LOOKUP", "INDEX", "PUBLIC", "HOST", "DEDUP",
                               "IDEMPOTENCY", "SHARD", "COMPOSITE", "DICT", "MAP"])
# Names that are secret although no part says so.
_SECRET_NAMES = frozenset(
    [
        # Open MPI's per-job PSM/OFI authentication key.
        "OMPI_MCA_ORTE_PRECONDITION_TRANSPORTS",
        "OMPI_MCA_ORTE_PRECONDITION_TRANSPORTS_KEY",
    ]
)
# Names that are not secret although a part says so (PWD: the working directory).
_PLAIN_NAMES = frozenset(["PWD", "OLDPWD"])

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

# every secret word above holds one of these: a name without any is read no further
_SECRET_HINT_RE = re.compile(r"(?i)key|pas|pw|auth|sess|dsn|hook|sig|otp|salt|tok|secret|priv|"
                             r"cred|cookie")
_SPLIT_RE = re.compile(r"[^A-Z0-9]+")
_CAMEL_RE = re.compile(r"([a-z0-9])(?=[A-Z])")


def _parts(name: str) -> List[str]:
    return [p for p in _SPLIT_RE.split(_CAMEL_RE.sub("\\1_", name).upper()) if p]


def is_secret_name(name: str) -> bool:
    """True when a variable name looks like it holds a secret.

    Works on the ``_``-separated parts of the name, so NCCL_IB_PKEY (part
    PKEY) and XDG_..._KEYBOARD are not secrets while AWS_ACCESS_KEY_ID,
    HF_TOKEN, DB_PASSWORD and GITHUB_APIKEY are; camelCase words are parts too
    (AccountKey, SharedAccessKey: the keys of a storage connection string).
    """
    upper = name.upper()
    if upper in _SECRET_NAMES:
        return True
    if upper in _PLAIN_NAMES or not _SECRET_HINT_RE.search(name):
        return False
    parts = _parts(name)
    for i, part in enumerate(parts):
        if part in _NOT_SECRET_PARTS:
            continue
        if part in ("KEY", "KEYS") and i and parts[i - 1] in _LOOKUP_KEY_WORDS:
            continue  # a cache key, a unit key, a host's public key: no secret
        if part in _SECRET_PARTS_EXACT:
            return True
        for word in _SECRET_PARTS_SUBSTR:
            if word in part:
                return True
    return False


# --- the allow list: harmless values of secret-looking names ------------------------------

_BOOLEANS = frozenset(["true", "false", "yes", "no", "on", "off", "none", "null", "nil",
                       "enabled", "disabled", "enable", "disable", "y", "n", "~"])
# the name's last word says the value is a number ...
_COUNT_WORDS = frozenset(["COUNT", "COUNTS", "NUM", "NUMBER", "MAX", "MIN", "SIZE", "LEN",
                          "LENGTH", "LIMIT", "TIMEOUT", "TTL", "RETRIES", "TOKENS", "LINES",
                          "SECONDS", "S", "MS", "DAYS", "HOURS", "MINUTES", "BITS", "BYTES"])
# ... (or its first word does: MAX_TOKENS, NUM_KEYS)
_COUNT_FIRST_WORDS = frozenset(["MAX", "MIN", "NUM", "N"])
# ... a setting, one word or a boolean
_SETTING_WORDS = frozenset(["MODE", "TYPE", "LEVEL", "ENABLE", "ENABLED", "DISABLE",
                            "DISABLED", "PARALLELISM", "METHOD", "BACKEND", "PROVIDER",
                            "POLICY", "STRATEGY", "SCHEME", "FORMAT", "KIND", "ALGORITHM",
                            "REQUIRED", "VERIFY", "INSECURE", "AUTHENTICATION",
                            "CHECKING"])
# ... a name
_NAME_WORDS = frozenset(["NAME", "NAMES", "LABEL", "USER", "USERNAME"])
# ... a path or a prefix
_PATH_WORDS = frozenset(["PREFIX", "PATH", "FILE", "DIR", "HOME", "ROOT", "LOCATION"])

_NUMBER_RE = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$")
_WORD_RE = re.compile(r"^[A-Za-z]+(?:[_.\-][A-Za-z]+)*[0-9]?$")
_PLAIN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
_PATH_VALUE_RE = re.compile(r"^[A-Za-z0-9_.~/\-]{1,255}$")


def _unquoted(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _shaped(value: str) -> bool:
    """Does the value hold a token of a known shape or a long mixed-case blob?"""
    return bool(_TOKENS_RE.search(value)) or _redact_blobs(value) != value


def keeps(name: str, value: str) -> bool:
    """True when the value of a secret-looking ``name`` is harmless and may stay: a number
    where the name's last word is a count (``PASS_COUNT``, ``MAX_TOKENS``), a boolean or one
    word where it is a setting (``AUTH_MODE=none``), a plain name where it is a name
    (``SESSION_NAME``), a path where it is a path or prefix (``KEY_PREFIX=runs/``). A token of
    a known shape or a long blob is never kept, whatever the name."""
    parts = _parts(name)
    v = _unquoted(value.strip())
    if not parts or not v or v == REDACTED or _shaped(v):
        return False
    last = parts[-1]
    counted = last in _COUNT_WORDS or parts[0] in _COUNT_FIRST_WORDS and len(parts) > 1
    if counted and _NUMBER_RE.match(v):
        return True
    if last in _SETTING_WORDS:
        return v.lower() in _BOOLEANS or (len(v) <= 24 and bool(_WORD_RE.match(v)))
    if last in _NAME_WORDS:
        return bool(_PLAIN_NAME_RE.match(v))
    if last in _PATH_WORDS:
        return bool(_PATH_VALUE_RE.match(v))
    return False


# Well-known token shapes.
_TOKEN_RES = [
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),  # GitHub
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"),
    re.compile(r"\bglpat-[A-Za-z0-9_\-]{20,}"),  # GitLab
    re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[0-9A-Z]{16}\b"),  # AWS key id
    re.compile(r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{20,}"),  # Hugging Face
    re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}"),  # Slack
    re.compile(r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_\-]{20,}"),  # OpenAI / Anthropic
    re.compile(r"\bAIza[0-9A-Za-z_\-]{35}"),  # Google API key
    re.compile(r"\bya29\.[0-9A-Za-z_\-]{20,}"),  # Google OAuth access token
    re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),  # JWT
    re.compile(r"\bnpm_[A-Za-z0-9]{30,}"),
    re.compile(r"\bpypi-[A-Za-z0-9_\-]{30,}"),
    re.compile(r"\bwandb_v1_[A-Za-z0-9_\-]{20,}"),
]
# the shapes in one pass (each alone is a pass over the text); every shape begins with
# one of the letters the lookahead lists, which spares trying them all at every character
_TOKENS_RE = re.compile("(?=[AaGghxsyenpw])(?:" + "|".join(f"(?:{rx.pattern})" for rx in _TOKEN_RES)
                        + ")")

# Long base64/base64url/hex runs (used on values of unlisted variables only).
_BLOB_RE = re.compile(r"[A-Za-z0-9+/=_\-]{32,}")
_UUID_RE = re.compile(
    r"^(?:GPU-|MIG-)?[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
_HEX_RE = re.compile(r"^[0-9a-fA-F]+$")
# an image or content digest: sha256: and exactly 64 hex digits (sha512: 128)
_DIGEST_BEFORE_RE = re.compile(r"(?:sha256|sha512|sha384|sha1):$")
_DIGEST_LENGTHS = {"sha1:": 40, "sha256:": 64, "sha384:": 96, "sha512:": 128}


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
        run = m.group(0)
        before = value[max(0, m.start() - 7):m.start()]
        for prefix, length in _DIGEST_LENGTHS.items():  # an image digest: sha256:<64 hex>
            if before.endswith(prefix) and len(run) == length and _HEX_RE.match(run):
                return run
        return REDACTED if _looks_like_blob(run) else run

    return _BLOB_RE.sub(sub, value)


# Names whose value is a commit or content hash, or an id: hex (and, for an id, lower-case
# letters, digits and separators) is what they hold, not a secret.
_COMMIT_WORDS = frozenset(["COMMIT", "SHA", "REV", "REVISION", "HASH", "DIGEST", "GITSHA"])
_ID_WORDS = frozenset(["ID", "UUID", "RUNID"])
_LOWER_ID_RE = re.compile(r"^[0-9a-z][0-9a-z_.:\-]*$")


def _plain_hash_or_id(name: str, value: str) -> bool:
    """Is the value a commit hash in a commit's variable (GIT_COMMIT) or an id in an id's
    variable (RUN_ID), which the long-blob rule would take for a secret?"""
    parts = _parts(name)
    if not parts:
        return False
    if (parts[-1] in _COMMIT_WORDS or "COMMIT" in parts) and _HEX_RE.match(value):
        return 7 <= len(value) <= 64
    if parts[-1] in _ID_WORDS:
        return bool(_HEX_RE.match(value) or _UUID_RE.match(value) or _LOWER_ID_RE.match(value))
    return False
