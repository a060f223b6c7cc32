"""Keep secrets out of what gpuvet stores and prints.

Used on the node (environment variables, command output) and by the
controller (the ``env`` list nccl-tests writes into its JSON, the inventory
copy, suites in run.json, the index, imported files, what a command prints).
Standard library only, Python 3.8 compatible.

Public API:

- ``is_secret_name(name)``: does a variable name look like it holds a secret?
- ``redact_value(name, value)``: the value as it may be stored.
- ``scrub_env(mapping)``: a new dict with every value passed through
  ``redact_value`` (secret names keep their key, the value becomes ``***``).
- ``scrub_env_list(["K=V", ...])``: the same for a list of ``K=V`` strings.
- ``scrub_text(text)``: free text with secrets replaced by ``***``; the number
  of lines never changes (a scrubbed line stays a line), so line numbers that
  findings quote still point at the same line of a stored copy.
- ``scrub_lines(text)``: ``scrub_text`` (kept for the callers that name it).
- ``scrub_argv(argv)``: a command line as a list (``--password X`` is two arguments).
- ``scrub_doc(obj)``: a JSON-like document (a suite, a run's source, a
  supervisor's report) with every string scrubbed and the values of
  secret-looking keys replaced.
- ``keeps(name, value)``: is this value of a secret-looking name one of the
  harmless values the allow list keeps (a count, a mode, a name, a path)?

The forms read in free text (``NAME`` stands for a name that looks secret):
``NAME=value`` (nested ``A=NAME=value`` too), ``NAME: value``, ``NAME = value``,
``"NAME": "value"``, HTTP ``Authorization:`` headers (the scheme is kept),
``Bearer``, ``--NAME value``, ``mysql -pPW``, URL credentials (a password may
hold ``/`` and ``@``; a long token as the URL's user), private-key blocks
(PEM, SSH2, PuTTY: frames kept, every body line ``***``) and well-known token
shapes.

Names are read in parts: ``_``-separated and camelCase words, so the keys of
connection strings (``AccountKey=``, ``SharedAccessKey=``, ``Password=``) and
of query strings (``sig=``, ``token=``, ``X-Amz-Signature=``) are secret
wherever such a string appears.

The allow list (``keeps`` and the blob rule's exemptions): a name that looks
secret keeps a value that its last word says is harmless: a number for a count
(``PASS_COUNT=3``, ``MAX_TOKENS=4096``), a boolean or one word for a mode
(``AUTH_MODE=none``), a plain name for a name (``SESSION_NAME=run-7``), a path
for a path or prefix (``KEY_PREFIX=runs/``); a tokenizer is no token
(``TOKENIZERS_PARALLELISM``, ``TOKENIZER_NAME``). Values of other names keep
hex in a commit's key (``GIT_COMMIT``), hex or lower-case ids in an id's key
(``RUN_ID``) and image digests (``@sha256:`` and 64 hex digits), where the
long-blob rule would blank them. Anything else of those names, a token of a
known shape or a long mixed-case blob, is still scrubbed.
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


# --- shapes ---------------------------------------------------------------------------

# scheme://user:password@host -> scheme://user:***@host. The password is anything but
# white space up to the `@` after which the authority holds no other `@` (a password may
# hold `/` and `@`); a port and a path (host:8080/a@b) is not a password.
_URL_PASSWORD_RE = re.compile(
    r"([A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@]*:)(?!\d+(?:/|$|\s))(\S+?)(@)(?=[^\s@/?#]*(?:[/?#\s]|$))")
# scheme://TOKEN@host (a token as the user name, as git hosts take one) -> scheme://***@host;
# a user name of fewer than 20 characters stays
_URL_TOKEN_USER_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)([^/\s:@]{20,})(@)")

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
_BEARER_RE = re.compile(r"(?i)\b(bearer\s+)([A-Za-z0-9._~+/\-]{16,}=*)")
# An HTTP authorization header: the scheme stays, the credentials go (to the line's end).
_AUTH_HEADER_RE = re.compile(
    r"(?i)(\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?)"
    r"(?:(basic|bearer|token|digest|negotiate|ntlm|bot|apikey|aws4-hmac-sha256|hmac|otp)"
    r"(\s+))?([^\s\"'][^\n\"']*)")
# A private-key block's frame: PEM (-----BEGIN ... PRIVATE KEY-----, PGP's ... KEY BLOCK)
# and SSH2 (---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----).
_KEY_BEGIN_RE = re.compile(r"-{4,5} ?BEGIN ([A-Z0-9 ]*PRIVATE KEY[A-Z0-9 ]*?) ?-{4,5}")
_KEY_END_RE = re.compile(r"-{4,5} ?END [A-Z0-9 ]*-{4,5}")
# A body line of a key block: base64, an RFC 1421 or SSH2 header, a continuation, blank.
_KEY_BODY_RE = re.compile(r"^\s*(?:[A-Za-z0-9+/=\\]*|[A-Za-z][A-Za-z0-9\-]*:.*)\s*$")
# A PuTTY key file's lines (PuTTY-User-Key-File-2/3: ...): what may stay as written.
_PUTTY_KEEP = frozenset(["encryption", "comment", "public-lines", "private-lines",
                         "key-derivation", "argon2-memory", "argon2-passes",
                         "argon2-parallelism"])
_PUTTY_HEADER_RE = re.compile(r"^(\s*)([A-Za-z][A-Za-z0-9\-]*)(:\s*)(.*?)(\s*)$")
# NAME=value pairs in free text (env dumps, mount options, query strings);
# the value may be quoted.
_ASSIGN_RE = re.compile(
    r"([A-Za-z_][A-Za-z0-9_.\-]*)=(\"[^\"\n]*\"|'[^'\n]*'|[^\s&;,'\"]+)"
)
# NAME: value, "NAME": "value", NAME = value (YAML, JSON, HTTP headers, logs, INI files
# such as ~/.aws/credentials). An unquoted value runs to the end of its line (a `,`, `;`,
# `}` or `]` ends it too, as in a flow mapping).
_PAIR_HEAD_RE = re.compile(r"(?<![A-Za-z0-9_.\-])([\"']?)([A-Za-z_][A-Za-z0-9_.\-]*)\1"
                           r"(:[ \t]*|[ \t]+=[ \t]*|[ \t]*=[ \t]+)")
_PAIR_VALUE_RE = re.compile(r"\"(?:[^\"\\\n]|\\.)*\"|'[^'\n]*'|[^\s,;{}\[\]'\"][^\n,;}\]]*")
# A YAML value that is an alias, a block scalar's indicator, or an anchor before a value.
_YAML_NODE_RE = re.compile(r"^(?:\*[^\s,\]}]+\s*$|[|>][0-9+\-]*\s*$|(&[^\s,\]}]+\s+)(\S))")
_JSON_SCALAR_RE = re.compile(r"^(?:-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null)\s*$")
# --NAME value: a command-line flag that names a secret, and its value.
_FLAG_RE = re.compile(r"(?<![\w\-])(--?[A-Za-z][A-Za-z0-9_\-]*)([ \t]+)(\"[^\"\n]*\"|'[^'\n]*'|"
                      r"[^\s\-\"'][^\s]*)")
# the last word of a flag that takes a secret (--password, --hf-token, --api-key)
_FLAG_WORDS = frozenset(["PASSWORD", "PASSWD", "PASS", "PASSPHRASE", "PW", "PWD", "TOKEN",
                         "SECRET", "KEY", "APIKEY", "CREDENTIALS", "CREDENTIAL", "AUTH",
                         "COOKIE", "SIG", "SIGNATURE", "OTP"])
# The password glued to -p of mysql's and sshpass's command lines (-pPW).
_GLUED_P_RE = re.compile(r"(\b(?:mysql\w*|mariadb[\w\-]*|sshpass)\b[^\n|;&]*?\s-p)(?=\S)"
                         r"(\"[^\"\n]*\"|'[^'\n]*'|\S+)")

# Long base64/base64url/hex runs (used on values of unlisted variables only).
_BLOB_RE = re.compile(r"[A-Za-z0-9+/=_\-]{32,}")
_UUID_RE = re.compile(
    r"^(?:GPU-|MIG-)?[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
_HEX_RE = re.compile(r"^[0-9a-fA-F]+$")
# an image or content digest: sha256: and exactly 64 hex digits (sha512: 128)
_DIGEST_BEFORE_RE = re.compile(r"(?:sha256|sha512|sha384|sha1):$")
_DIGEST_LENGTHS = {"sha1:": 40, "sha256:": 64, "sha384:": 96, "sha512:": 128}


def _redacted_keeping_quotes(value: str) -> str:
    quote = value[0] if value[:1] in ("'", '"') else ""
    return quote + REDACTED + quote


def _assign_sub(m: "re.Match[str]") -> str:
    name, value = m.group(1), m.group(2)
    if not is_secret_name(name):
        if "=" in value:  # nested: AZ_CLIENT=client_secret=...
            return name + "=" + _ASSIGN_RE.sub(_assign_sub, value)
        return m.group(0)
    if keeps(name, value):
        return m.group(0)
    return name + "=" + _redacted_keeping_quotes(value)


def _pair_value(quote: str, name: str, sep: str, value: str) -> Optional[str]:
    """The pair as it may be kept, or None when it stays as written."""
    if (not is_secret_name(name) or name.endswith(("Error", "Exception", "Warning"))
            or value.startswith(REDACTED) or keeps(name, value.rstrip())):
        return None
    if quote and _JSON_SCALAR_RE.match(value):
        return None  # a JSON number or boolean, as scrub_doc keeps them
    anchor = _YAML_NODE_RE.match(value)
    if anchor is not None:  # an alias (`*name`) or a block scalar's `|`: no value here
        if anchor.group(2) is None:
            return None
        value = value[anchor.end(1):]
        sep += anchor.group(1)
    if value[:1] in ("'", '"'):
        new = _redacted_keeping_quotes(value)
    else:  # the spaces and closing quotes after the value stay
        stripped = value.rstrip(" \t'\"")
        new = REDACTED + value[len(stripped):]
    return quote + name + quote + sep + new


_IDENT_RE = re.compile(r"[_\-.A-Z0-9]")
_PAIR_START_RE = re.compile(r"(?:^|[,{;(\[|&:]|^\s*-)\s*$")


def _in_prose(text: str, m: "re.Match[str]") -> bool:
    """A plain lowercase word before a colon in the middle of a sentence ("remove the old
    key: ssh-keygen -R host") is prose, not a `NAME: value` pair: a pair's name is quoted,
    looks like an identifier (`HF_TOKEN`, `api-key`, `aws.secret`), or starts its line or
    a mapping entry or a command (`password: x` in YAML, `url: x, password: y`, after `&&`)."""
    if m.group(1) or not m.group(3).startswith(":") or _IDENT_RE.search(m.group(2)):
        return False
    before = text[text.rfind("\n", 0, m.start()) + 1:m.start()]
    return _PAIR_START_RE.search(before) is None


def _scrub_pairs(text: str) -> str:
    """Each `NAME: value` / `NAME = value` pair whose name looks secret, its value replaced.
    The value is read only after a secret name, so a pair of another name never swallows
    the pair after it (`url: x, password: y` on one line)."""
    out: List[str] = []
    pos = 0
    for m in _PAIR_HEAD_RE.finditer(text):
        if m.start() < pos or not is_secret_name(m.group(2)):
            continue
        if _in_prose(text, m):
            continue
        value = _PAIR_VALUE_RE.match(text, m.end())
        if value is None:
            continue
        new = _pair_value(m.group(1), m.group(2), m.group(3), value.group(0))
        if new is None:
            continue
        out.append(text[pos:m.start()])
        out.append(new)
        pos = value.end()
    if not out:
        return text
    out.append(text[pos:])
    return "".join(out)


def _auth_sub(m: "re.Match[str]") -> str:
    creds = m.group(4)
    if creds.startswith(REDACTED):
        return m.group(0)
    stripped = creds.rstrip()
    return (m.group(1) + (m.group(2) or "") + (m.group(3) or "") + REDACTED
            + creds[len(stripped):])


def _flag_sub(m: "re.Match[str]") -> str:
    flag, value = m.group(1), m.group(3)
    name = flag.lstrip("-")
    parts = _parts(name)
    if not parts or parts[-1] not in _FLAG_WORDS:
        return m.group(0)  # -p 22, --accept-new-host-keys: no secret follows
    if not is_secret_name(name) or value.startswith(REDACTED) or keeps(name, value):
        return m.group(0)
    return flag + m.group(2) + _redacted_keeping_quotes(value)


def _scrub_key_blocks(text: str) -> str:
    """Private-key blocks with their frames kept and every body line `***`: as many lines
    as before. A block without its END line ends at the first line that is no key body."""
    lines = text.split("\n")
    out: List[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        begin = _KEY_BEGIN_RE.search(line)
        if begin is None:
            out.append(line)
            i += 1
            continue
        rest = line[begin.end():]
        end = _KEY_END_RE.search(rest)
        if end is not None:  # one line (a JSON string with \n escapes)
            out.append(line[:begin.end()] + REDACTED + rest[end.start():])
            i += 1
            continue
        out.append(line[:begin.end()] + (REDACTED if rest.strip() else rest))
        i += 1
        while i < len(lines):
            body = lines[i]
            end = _KEY_END_RE.search(body)
            if end is not None:
                out.append(body[:len(body) - len(body.lstrip())] + body[end.start():])
                i += 1
                break
            if not _KEY_BODY_RE.match(body):
                break
            indent = body[:len(body) - len(body.lstrip())]
            out.append(indent + REDACTED if body.strip() else body)
            i += 1
    return "\n".join(out)


def _scrub_putty(text: str) -> str:
    """A PuTTY key file's lines: its header and the line counts stay, the key lines and the
    MAC become `***`, line by line."""
    lines = text.split("\n")
    out: List[str] = []
    in_key = False
    for line in lines:
        if "PuTTY-User-Key-File" in line:
            in_key = True
            out.append(line)
            continue
        if not in_key:
            out.append(line)
            continue
        header = _PUTTY_HEADER_RE.match(line)
        if header is not None and header.group(2).lower() in _PUTTY_KEEP:
            out.append(line)
        elif header is not None:
            out.append(header.group(1) + header.group(2) + header.group(3) + REDACTED)
            if header.group(2).lower() in ("private-mac", "private-hash"):
                in_key = False  # the key's last line
        elif re.match(r"^\s*[A-Za-z0-9+/=]+\s*$", line):
            out.append(line[:len(line) - len(line.lstrip())] + REDACTED)
        else:
            in_key = False
            out.append(line)
    return "\n".join(out)


def scrub_text(text: str) -> str:
    """Free text with secrets replaced by ``***``, line for line.

    Redacts URL passwords (keeping the user) and tokens given as a URL's user,
    ``NAME=value``, ``NAME: value``, ``NAME = value`` and ``"NAME": "value"`` pairs whose
    name (connection strings' and query strings' keys too) looks secret, unless the
    allow list (``keeps``) keeps the value; ``--NAME value`` flags, ``mysql -pPW``,
    HTTP ``Authorization`` headers and ``Bearer <token>`` (the scheme stays), private-key
    blocks (PEM, SSH2, PuTTY; each body line becomes ``***``) and well-known token shapes
    (GitHub, GitLab, AWS key ids, Hugging Face, Slack, OpenAI, Google, JWT, npm, PyPI,
    W&B). Everything else is left as it is, so the output of nvidia-smi and friends
    still parses, and the text keeps its number of lines.
    """
    if not text:
        return text
    if "BEGIN" in text:
        text = _scrub_key_blocks(text)
    if "PuTTY-User-Key-File" in text:
        text = _scrub_putty(text)
    if "://" in text:
        text = _URL_PASSWORD_RE.sub("\\1" + REDACTED + "\\3", text)
        text = _URL_TOKEN_USER_RE.sub("\\1" + REDACTED + "\\3", text)
    if "=" in text:
        text = _ASSIGN_RE.sub(_assign_sub, text)
    if ":" in text or "=" in text:
        if "uthorization" in text or "UTHORIZATION" in text:
            text = _AUTH_HEADER_RE.sub(_auth_sub, text)
        text = _scrub_pairs(text)
    if "-" in text:
        text = _FLAG_RE.sub(_flag_sub, text)
        if "-p" in text:
            text = _GLUED_P_RE.sub(lambda m: m.group(1) + REDACTED, text)
    text = _BEARER_RE.sub("\\1" + REDACTED, text)
    return _TOKENS_RE.sub(REDACTED, text)


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


def redact_value(name: str, value: Optional[str]) -> Optional[str]:
    """The value of variable ``name`` as it may be stored.

    ``***`` when the name looks secret (unless ``keeps`` keeps the value) or the value
    holds a PEM block; else the value with URL passwords and token shapes redacted and,
    unless the variable is a known path/device-list variable or the value a commit
    hash or id in its own variable, long base64/hex runs (32+ characters, mixed
    letters and digits; an image digest `sha256:` + 64 hex digits stays) replaced by
    ``***``.
    """
    if value is None:
        return None
    if "-----BEGIN" in value or "---- BEGIN" in value:
        return REDACTED
    if is_secret_name(name):
        return value if keeps(name, value) else REDACTED
    value = scrub_text(value)
    if not _blob_exempt(name) and not _plain_hash_or_id(name, value):
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


def scrub_argv(argv: Iterable[str]) -> List[str]:
    """A command line as a list, each argument through ``scrub_text`` and the argument after
    a flag that takes a secret (``--password``, ``--hf-token``; ``-p`` of mysql is glued)
    replaced: the flag and its value are two arguments, which ``scrub_text`` alone
    would read one at a time."""
    out: List[str] = []
    secret_next = False
    for arg in argv:
        if secret_next and not arg.startswith("-"):
            out.append(REDACTED)
            secret_next = False
            continue
        name = arg.lstrip("-")
        parts = _parts(name)
        # --password, --hf-token; of one dash only a whole word (-password, not -pSecret)
        secret_next = ("=" not in arg and bool(parts) and parts[-1] in _FLAG_WORDS
                       and (arg.startswith("--") or arg.startswith("-") and len(parts) == 1
                            and name.upper() == parts[0]))
        out.append(scrub_text(arg))
    if out and out[0].rsplit("/", 1)[-1].startswith(("mysql", "mariadb", "sshpass")):
        out = [("-p" + REDACTED if a.startswith("-p") and len(a) > 2 and a != "-p" + REDACTED
                else a) for a in out]
    return out


def scrub_lines(text: str) -> str:
    """``scrub_text``, named for the callers that keep a file as written (an inventory
    copy): the number of lines never changes (a key block's body lines become one ``***``
    each) and ``NAME: value`` pairs are read."""
    return scrub_text(text)


def scrub_doc(obj: Any) -> Any:
    """A copy of a JSON-like document fit to store: every string through ``scrub_text``,
    the string value of a key whose name looks secret replaced by ``***`` unless the allow
    list keeps it (keys are kept; numbers, such as ``tokens_per_s``, stay)."""
    if isinstance(obj, str):
        return scrub_text(obj)
    if isinstance(obj, dict):
        return {k: (REDACTED if isinstance(v, str) and v and isinstance(k, str)
                    and is_secret_name(k) and not keeps(k, v) else scrub_doc(v))
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub_doc(v) for v in obj]
    return obj
