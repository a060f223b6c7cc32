"""payload.scrub: secret names, secret values, free text, env lists."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from payload.scrub import (  # noqa: E402
    REDACTED,
    is_secret_name,
    redact_value,
    scrub_env,
    scrub_env_list,
    scrub_text,
)
from tests.unit.testkeys import (  # noqa: E402
    aws_key_pair,
    frame_and_body,
    private_key,
    storage_account_key,
)

GHP = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"
# made when the tests run: no AWS key, not even the published example, sits here
AKIA, AWS_SECRET = aws_key_pair()


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "FOO_TOKEN",
        "GITHUB_TOKEN",
        "GH_AUTH_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_ACCESS_KEY_ID",
        "AWS_SESSION_TOKEN",
        "DB_PASSWORD",
        "MYSQL_PWD_PASSWD",
        "SSH_PASS",
        "OPENAI_API_KEY",
        "GITHUB_APIKEY",
        "apiKey",
        "client_secret",
        "PRIVATE_KEY",
        "SSH_PRIVATE_KEY_PATH",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "DOCKER_AUTH",
        "OAUTH_CLIENT",
        "HTTP_COOKIE",
        "SENTRY_DSN",
        "SLACK_WEBHOOK_URL",
        "WANDB_API_KEY",
        "GPG_PASSPHRASE",
        "OMPI_MCA_orte_precondition_transports",
    ],
)
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "NCCL_IB_PKEY",
        "NCCL_DEBUG",
        "NCCL_SOCKET_IFNAME",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "PATH",
        "PWD",
        "LD_LIBRARY_PATH",
        "UCX_TLS",
        "OMPI_COMM_WORLD_RANK",
        "PMIX_RANK",
        "GIT_AUTHOR_NAME",
        "KEYBOARD_LAYOUT",
        "MONKEY_BUSINESS",
        "PASSTHROUGH_MODE",
        "BYPASS_PROXY",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    ],
)
def test_non_secret_names(name: str) -> None:
    assert not is_secret_name(name)


def test_redact_value_secret_name() -> None:
    assert redact_value("HF_TOKEN", "whatever") == REDACTED
    assert redact_value("NCCL_IB_PKEY", "0x8001") == "0x8001"
    assert redact_value("X", None) is None


def test_redact_value_token_shapes_in_innocent_names() -> None:
    for value in (GHP, HF, AKIA, "sk-" + "a" * 20 + "B1" * 5):
        assert redact_value("SOME_VAR", value) == REDACTED
        assert value not in redact_value("SOME_VAR", "x " + value + " y")  # type: ignore[operator]


def test_redact_value_pem_block() -> None:
    pem = private_key("openssh")  # made now: no key sits in the repository
    assert redact_value("SOMETHING", pem) == REDACTED
    # a certificate is redacted too in an env value (conservative)
    assert redact_value("SOMETHING", "-----BEGIN CERTIFICATE-----abc") == REDACTED


def test_redact_value_url_password() -> None:
    v = redact_value("HTTPS_PROXY", "http://alice:s3cr3t-pw@proxy.example:3128/")
    assert v == "http://alice:***@proxy.example:3128/"
    # user without password is left alone
    assert redact_value("X", "https://alice@host/x") == "https://alice@host/x"


def test_redact_value_long_blob() -> None:
    blob = "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZmdo"
    assert redact_value("MY_SETTING", "prefix:" + blob) == "prefix:" + REDACTED
    assert redact_value("MY_SETTING", AWS_SECRET) == REDACTED
    # 32+ hex with letters and digits
    assert redact_value("MY_SETTING", "a3f5" * 10) == REDACTED


def test_redact_value_blob_exemptions() -> None:
    uuid = "GPU-3f2a1b4c-5d6e-7f80-91a2-b3c4d5e6f708"
    assert redact_value("CUDA_VISIBLE_DEVICES", uuid) == uuid
    # a UUID is not a blob even in an unlisted variable
    assert redact_value("MY_GPU", uuid) == uuid
    nix = "/nix/store/0c1r2ks3m4x5p6q7z8y9w0v1u2t3s4R5-python3/bin:/usr/bin"
    assert redact_value("PATH", nix) == nix
    assert redact_value("SOME_HOME", "/opt/nvidia/hpc_sdk/Linux_x86_64/24.5/comm") == (
        "/opt/nvidia/hpc_sdk/Linux_x86_64/24.5/comm"
    )
    # ordinary values survive
    for v in ("INFO", "eth0,ib0", "mlx5_0:1", "0,1,2,3", "2.28.3-1", "9.0a;8.0"):
        assert redact_value("NCCL_X", v) == v


def test_scrub_env() -> None:
    env = {
        "CUDA_VISIBLE_DEVICES": "0",
        "NCCL_DEBUG": "INFO",
        "NCCL_IB_PKEY": "0x8001",
        "FOO_TOKEN": "abc-unique-1",
        "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
        "HF_TOKEN": HF,
        "UCX_PROXY": "https://bob:pw-unique-2@h.example",
    }
    out = scrub_env(env)
    assert set(out) == set(env)
    assert out["CUDA_VISIBLE_DEVICES"] == "0"
    assert out["NCCL_DEBUG"] == "INFO"
    assert out["NCCL_IB_PKEY"] == "0x8001"
    assert out["FOO_TOKEN"] == REDACTED
    assert out["AWS_SECRET_ACCESS_KEY"] == REDACTED
    assert out["HF_TOKEN"] == REDACTED
    assert out["UCX_PROXY"] == "https://bob:***@h.example"
    text = repr(out)
    for secret in ("abc-unique-1", AWS_SECRET, HF, "pw-unique-2"):
        assert secret not in text
    # the input is not modified
    assert env["HF_TOKEN"] == HF


def test_scrub_env_list_like_nccl_tests_json() -> None:
    items = [
        "NCCL_DEBUG=INFO",
        "NVIDIA_VISIBLE_DEVICES=0,1",
        "CUDA_HOME=/usr/local/cuda",
        "HF_TOKEN=" + HF,
        "GITHUB_TOKEN=" + GHP,
        "EMPTY=",
        "WEIRD_NO_EQUALS " + GHP,
        "LS_COLORS=rs=0:di=01;34",
    ]
    out = scrub_env_list(items)
    assert out[:3] == items[:3]
    assert out[3] == "HF_TOKEN=***"
    assert out[4] == "GITHUB_TOKEN=***"
    assert out[5] == "EMPTY="
    assert GHP not in out[6]
    assert out[7] == "LS_COLORS=rs=0:di=01;34"


def test_scrub_text() -> None:
    rsa_pem = private_key("rsa")
    text = (
        "line1 https://user:hunter2-unique@git.example/repo.git\n"
        "export HF_TOKEN=" + HF + "\n"
        "declare -x FOO_TOKEN=\"quoted-unique\"\n"
        "AWS_SECRET_ACCESS_KEY=" + AWS_SECRET + "\n"
        "Authorization: Bearer abcdefghijklmnopqrstuvwxyz012345\n"
        "key id " + AKIA + " and " + GHP + "\n"
        "NCCL_IB_PKEY=0x8001 NCCL_DEBUG=INFO\n"
        f"{rsa_pem}\n"
        "tail\n"
    )
    out = scrub_text(text)
    for secret in ("hunter2-unique", HF, "quoted-unique", AWS_SECRET, AKIA, GHP,
                   *frame_and_body(rsa_pem)[1], "abcdefghijklmnopqrstuvwxyz012345"):
        assert secret not in out
    assert "https://user:***@git.example/repo.git" in out
    assert 'FOO_TOKEN="***"' in out
    assert "NCCL_IB_PKEY=0x8001 NCCL_DEBUG=INFO" in out
    assert out.startswith("line1 ") and out.endswith("tail\n")


# captured outputs that hold a value the scrubber takes, on purpose: nccl-tests -J files
# whose env lists placeholders for HF_TOKEN and friends, and a kernel log's "kernel key:"
CHANGED_ON_PURPOSE = {"all_reduce_2.19.6_per-iter_h100.json", "alltoall_2.17.6_json-v1.json",
                      "dmesg.txt"}


@pytest.mark.parametrize("folder", ["h200x2", "h200x2-gpuvet", "recipe-h200x1",
                                    "recipe-h200x1-extras", "poc", "nccl-tests", "public",
                                    "h200x1-health"])
def test_scrub_text_leaves_tool_output_alone(folder: str) -> None:
    """Real captured output (nvidia-smi, XML, UUIDs, nccl-tests logs, NCCL INFO, kernel
    logs, other tools' outputs) passes unchanged; every file keeps its lines."""
    fixtures = ROOT / "tests" / "fixtures" / folder
    files = sorted(p for p in fixtures.rglob("*") if p.is_file() and p.stat().st_size < 4 << 20)
    if not files:
        pytest.skip("fixtures not present")
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        out = scrub_text(text)
        assert out.count("\n") == text.count("\n"), path
        if path.name not in CHANGED_ON_PURPOSE:
            assert out == text, path


def test_scrub_env_list_on_nccl_tests_json_fixtures() -> None:
    """nccl-tests -J writes the whole environment; secrets go, NCCL/CUDA vars stay."""
    files = sorted((ROOT / "tests" / "fixtures").rglob("*.json"))
    checked = 0
    for path in files:
        try:
            doc = json.loads(path.read_text())
        except ValueError:
            continue
        if not isinstance(doc, dict) or not isinstance(doc.get("env"), list):
            continue
        env = doc["env"]
        out = scrub_env_list(env)
        assert len(out) == len(env)
        for before, after in zip(env, out, strict=True):
            name = before.partition("=")[0]
            if is_secret_name(name):
                assert after == name + "=***", path.name
            elif name.startswith(("NCCL_", "CUDA_", "NVIDIA_")):
                assert after == before, path.name
        checked += 1
    if not checked:
        pytest.skip("no nccl-tests JSON fixtures")


# made when the tests run, so that no key sits in the repository
ACCOUNT_KEY = storage_account_key()


@pytest.mark.parametrize("name", ["AccountKey", "SharedAccessKey", "accountKey",
                                  "SharedAccessSignature", "Password", "sig",
                                  "X-Amz-Signature", "access_token", "apiKey"])
def test_keys_of_connection_and_query_strings_are_secret(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["AccountName", "EndpointSuffix", "DefaultEndpointsProtocol",
                                  "KeyboardLayout", "MonkeyBusiness", "BlobEndpoint", "sv",
                                  "sp", "NCCL_IB_PKEY"])
def test_their_other_keys_are_not(name: str) -> None:
    assert not is_secret_name(name)


def test_a_connection_string_keeps_everything_but_its_key() -> None:
    conn = (f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={ACCOUNT_KEY};"
            "EndpointSuffix=core.windows.net")
    want = ("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=***;"
            "EndpointSuffix=core.windows.net")
    assert scrub_text(f"storage: {conn}\n") == f"storage: {want}\n"
    # as the value of a variable whose name says nothing
    assert redact_value("AZURE_STORAGE_CONNECTION_STRING", conn) == want
    sb = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=root;SharedAccessKey=k1Z"
    assert scrub_text(sb).startswith("Endpoint=sb://ns.servicebus.windows.net/;")
    assert scrub_text(sb).endswith(";SharedAccessKey=***")
    odbc = "Server=db;User Id=app;Password=hunter2;Database=x"
    assert scrub_text(odbc) == "Server=db;User Id=app;Password=***;Database=x"


def test_urls_lose_their_tokens_not_their_shape() -> None:
    sas = "https://a.blob.core.windows.net/c/f?sv=2022-11-02&sp=r&sig=AbC%2Bd3f%3D&se=2026"
    assert scrub_text(sas) == "https://a.blob.core.windows.net/c/f?sv=2022-11-02&sp=r&sig=***&se=2026"
    assert scrub_text("https://h/x?access_token=abc123&page=2") == \
        "https://h/x?access_token=***&page=2"
    token = "0123456789abcdef" * 2 + "01234567"
    assert scrub_text(f"git clone https://{token}@github.com/o/r.git") == \
        "git clone https://***@github.com/o/r.git"
    # a user name is no token: short users stay, a password goes
    assert scrub_text("https://git@host/r ssh://ci:pw@h/") == "https://git@host/r ssh://ci:***@h/"


def test_scrub_doc_scrubs_every_string_and_secret_keys() -> None:
    from payload.scrub import scrub_doc

    doc = {"nccl": {"source": {"url": "https://ci:pw@h/r.git", "commit": "a" * 40}},
           "train": {"command": f"env WANDB_API_KEY=w1 HF_TOKEN={HF} python t.py", "steps": 3,
                     "keep_checkpoints": False, "api_key": "plain"},
           "argv": ["/bin/sh", "-c", "AccountKey=abc; run"], "none": None}
    assert scrub_doc(doc) == {
        "nccl": {"source": {"url": "https://ci:***@h/r.git", "commit": "a" * 40}},
        "train": {"command": "env WANDB_API_KEY=*** HF_TOKEN=*** python t.py", "steps": 3,
                  "keep_checkpoints": False, "api_key": "***"},
        "argv": ["/bin/sh", "-c", "AccountKey=***; run"], "none": None}


def test_scrub_lines_keeps_the_line_count() -> None:
    from payload.scrub import scrub_lines

    begin, body, end = frame_and_body(private_key("rsa"))
    block = "".join(f"  {line}\n" for line in (begin, *body, end))
    text = f"a: 1\nkey: |\n{block}b\n"
    out = scrub_lines(text)
    assert out.count("\n") == text.count("\n") and not [x for x in body if x in out]
    assert scrub_lines("DB_PASSWORD: p1\n") == "DB_PASSWORD: ***\n"


def test_a_word_before_a_colon_in_a_sentence_is_prose_not_a_pair() -> None:
    """gpuvet's own hint ("remove the old key: ssh-keygen -R HOST") reads like `key: value`;
    a plain word in the middle of a sentence is no pair's name, while the same word that
    starts a line, a mapping entry or a command still is."""
    hint = "confirm the new fingerprint, then remove the old key: ssh-keygen -R 10.0.0.1"
    assert scrub_text(hint) == hint
    assert scrub_text("password: hunter2xyz") == "password: ***"
    assert scrub_text("  - token: abcdefgh1234") == "  - token: ***"
    assert scrub_text("ok && password: hunter2xyz") == "ok && password: ***"
    assert scrub_text("the api_key: abcdefgh1234") == "the api_key: ***"
