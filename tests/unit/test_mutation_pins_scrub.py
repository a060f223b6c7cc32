"""payload.scrub at its edges: what is replaced, exactly, and what must be left alone.

Too little redaction stores a secret; too much breaks the outputs the parsers
read (paths, GPU UUIDs, hashes in PATH). Values are assembled at run time so
that no secret-shaped string sits in the repository.
"""

from __future__ import annotations

from payload.scrub import (
    REDACTED,
    is_secret_name,
    redact_value,
    scrub_env,
    scrub_env_list,
    scrub_text,
)
from tests.unit.testkeys import private_key

MIXED31 = "Ab1" * 10 + "C"  # upper, lower and digits: a blob once 32 long
BASE64 = "Zm9vYmFyYmF6" + "MTIzNDU2Nzg5MEFCQ0RFRkdISUpL"


def test_names_with_leading_or_doubled_separators_are_still_read_part_by_part() -> None:
    assert is_secret_name("_HF_TOKEN") and is_secret_name("__API__KEY")
    assert is_secret_name("-db-password")
    assert not is_secret_name("__NCCL_IB_PKEY")


def test_assignments_keep_their_quotes_and_nothing_else() -> None:
    user = "svc"
    pw = "pw-" + "9x7" * 3
    assert scrub_text(f"HF_TOKEN={pw} next") == "HF_TOKEN=*** next"
    assert scrub_text(f"DB_PASSWORD='{pw} x' USER={user}") == f"DB_PASSWORD='***' USER={user}"
    assert scrub_text(f'DB_PASSWORD="{pw}";') == 'DB_PASSWORD="***";'


def test_a_private_key_block_keeps_its_frame_only() -> None:
    kind = "OPENSSH PRIVATE KEY"
    block = private_key("openssh")  # made now: no key sits in the repository
    assert block.startswith(f"-----BEGIN {kind}-----\n") and len(block.splitlines()) > 3
    body = block.splitlines()[1:-1]
    # line for line: the frame stays, each body line is one ***
    assert scrub_text(f"key:\n{block}\ndone") == (
        f"key:\n-----BEGIN {kind}-----\n" + f"{REDACTED}\n" * len(body)
        + f"-----END {kind}-----\ndone")
    # on one line (a JSON string's \n escapes) the frame stays around one ***
    escaped = block.replace("\n", "\\n")
    assert scrub_text(f'k = "{escaped}"') == \
        f'k = "-----BEGIN {kind}-----{REDACTED}-----END {kind}-----"'


def test_bearer_tokens_keep_the_scheme() -> None:
    token = "eyZ" + "a1B2c3D4" * 3
    assert scrub_text(f"Authorization: Bearer {token}") == "Authorization: Bearer ***"


def test_path_variables_keep_long_runs_whatever_the_case_of_their_name() -> None:
    value = f"src:{BASE64}"
    for name in ("PYTHONPATH", "pythonpath", "CUDA_VISIBLE_DEVICES", "NCCL_HOME", "tool_dir"):
        assert redact_value(name, value) == value, name
    assert redact_value("NOTE", value) == f"src:{REDACTED}"


def test_blob_length_counts_without_padding_and_edges() -> None:
    assert redact_value("NOTE", MIXED31 + "==") == MIXED31 + "=="  # 31 without the padding
    assert redact_value("NOTE", "--" + MIXED31 + "__") == "--" + MIXED31 + "__"
    assert redact_value("NOTE", MIXED31 + "D") == REDACTED  # 32
    assert redact_value("NOTE", "X" + MIXED31) == REDACTED  # only padding is not counted


def test_paths_numbers_and_words_are_not_blobs() -> None:
    path = "/opt/NVIDIA/hpc_sdk/Linux_x86_64/24.5/compilers/bin"
    assert redact_value("NOTE", path) == path
    number = "1234567890" * 4
    assert redact_value("NOTE", number) == number
    words = "abcdefghijklmnopqrstuvwxyzABCDEFGH"  # no digit
    assert redact_value("NOTE", words) == words
    lower_and_digits = "abcdefghijklmnopqrstuvwxyz0123456789"  # not hex, no upper case
    assert redact_value("NOTE", lower_and_digits) == lower_and_digits
    hex_digest = "0123456789abcdef" * 4  # a sha256: hex with digits and letters
    assert redact_value("NOTE", hex_digest) == REDACTED


def test_scrub_env_marks_a_variable_set_without_a_value() -> None:
    assert scrub_env({"EMPTY": None, "PLAIN": "1"}) == {  # type: ignore[dict-item]
        "EMPTY": REDACTED, "PLAIN": "1"}


def test_scrub_env_list_items_one_by_one() -> None:
    token_value = "abc" + "123XYZ" * 2
    blob = "NOTE=" + MIXED31 + "D"
    assert scrub_env_list([7, f"HF_TOKEN={token_value}=tail", "PLAIN=a=b", blob, "NOSEP"]) == [  # type: ignore[list-item]
        7, "HF_TOKEN=***", "PLAIN=a=b", "NOTE=***", "NOSEP"]
