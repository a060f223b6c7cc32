"""Scope as data: records hold provider, node and unit; text is made in one place."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from orchestrator.records import (
    Finding,
    finding,
    node_unit_key,
    provider_unit_key,
    subject_key,
    subject_label,
    unit_folder,
)


def test_a_provider_finding_is_shown_in_words_and_keyed_as_before() -> None:
    f = finding("r", "nccl", provider="h200-one", node=None, code="X", severity="WARN",
                message="m")
    assert (f.scope, f.node, f.provider) == ("provider", None, "h200-one")
    assert f.label == "provider h200-one (all nodes)" == subject_label("h200-one", None)
    assert f.subject == "provider:h200-one" == subject_key("h200-one", None)
    n = finding("r", "nccl", provider="h200-one", node="gpu-1", code="X", severity="WARN",
                message="m")
    assert n.label == n.subject == "gpu-1"


def test_scope_and_node_agree() -> None:
    base = {"run_id": "r", "provider": "p", "step": "s", "code": "X", "severity": "INFO",
            "message": "m"}
    for scope, node in (("node", None), ("provider", "gpu-1")):
        with pytest.raises(ValidationError, match="names its node"):
            Finding.model_validate({**base, "scope": scope, "node": node})


@pytest.mark.parametrize(("key", "folder"), [
    (node_unit_key("gpu-1"), ("nodes", "gpu-1")),
    (provider_unit_key("alpha", "multi"), ("providers", "alpha__multi")),
    (provider_unit_key("lab", "single-n1+n2"), ("providers", "lab__single-n1+n2")),
])
def test_unit_keys_keep_their_stored_form_and_folders(key: str,
                                                      folder: tuple[str, str]) -> None:
    # the form runs on disk already use: done.json paths and every record's unit_key
    assert key in ("node:gpu-1", "provider:alpha/multi", "provider:lab/single-n1+n2")
    assert unit_folder(key) == folder


def test_a_finding_quoting_a_secret_keeps_none_of_it() -> None:
    from orchestrator.records import finding

    token = "hf_" + "Qw3Er4Ty5Ui6" * 2
    f = finding("r", "train", provider="p", node="n", code="TRAIN_COMMAND_FAILED",
                severity="FAIL", message=f"your command exited: HF_TOKEN={token} rejected",
                line=f"Authorization: Bearer {token[3:]}", tokens_per_s=1234.5,
                lines=[f"AccountKey={token};"])
    text = f.model_dump_json()
    assert token not in text and token[3:] not in text
    assert f.message == "your command exited: HF_TOKEN=*** rejected"
    assert f.details["tokens_per_s"] == 1234.5 and f.details["lines"] == ["AccountKey=***;"]
