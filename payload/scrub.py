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

from payload.scrub_names import (  # noqa: F401 - REDACTED, is_secret_name, keeps: the API
    # (the rules live in scrub_names; here they are applied to text)
    _TOKENS_RE,
    REDACTED,
    _blob_exempt,
    _parts,
    _plain_hash_or_id,
    _redact_blobs,
    is_secret_name,
    keeps,
)

# --- shapes ---------------------------------------------------------------------------

# scheme://user:password@host -> scheme://user:***@host. The password is anything but
# white space up to the `@` after which the authority holds no other `@` (a password may
# hold `/` and `@`); a port and a path (host:8080/a@b) is not a password.
_URL_PASSWORD_RE = re.compile(
    r"([A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@]*:)(?!\d+(?:/|$|\s))(\S+?)(@)(?=[^\s@/?#]*(?:[/?#\s]|$))")
# scheme://TOKEN@host (a token as the user name, as git hosts take one) -> scheme://***@host;
# a user name of fewer than 20 characters stays
_URL_TOKEN_USER_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)([^/\s:@]{20,})(@)")

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
