"""The inventory copy a run keeps: no secret from `env` survives, every line keeps its number."""

from pathlib import Path

import pytest

from orchestrator import inventory
from orchestrator.errors import InventoryError
from tests.unit.testkeys import frame_and_body, private_key

# assembled here so that no secret-shaped string sits in the repository
TOKEN = "ghp_" + "a1B2c3D4" * 5
PASSWORD = "correct-horse-battery"
# a deploy key made when the tests run: no key sits in the repository
BEGIN, PEM_BODY, END = frame_and_body(private_key("openssh"))
PEM_BLOCK = "".join(f"            {line}\n" for line in PEM_BODY)  # indented for the YAML
PEM_ESCAPED = "\\n".join(PEM_BODY)  # the same lines inside a double-quoted YAML string
URL_SECRET = "s3cr3tpw"
PLAIN_SECRET = "letmein-42"


def inventory_text() -> str:
    return f"""# fleet with secrets in env (comment token: {TOKEN})
providers:
  p:
    access:
      env: {{NCCL_DEBUG: INFO, HF_TOKEN: {TOKEN}}}
    nodes:
      - name: n1
        host: 192.0.2.1
        env:
          DB_PASSWORD: "{PASSWORD}"
          SHARED: &shared "{PASSWORD}"
          DEPLOY_KEY: |
            {BEGIN}
{PEM_BLOCK}            {END}

          MIRROR: "https://ci:{URL_SECRET}@mirror.example.com/simple"
          ODD_NAME: "{BEGIN}\\n{PEM_ESCAPED}\\n{END}\\n"
          CUDA_VISIBLE_DEVICES: "0"
          GH_TOKEN: &tok {PLAIN_SECRET}
      - name: n2
        host: 192.0.2.2
        env: {{WEBHOOK_SECRET: *shared, PLAIN: "{TOKEN}", NOTE: *tok}}
"""


@pytest.fixture()
def original(tmp_path: Path) -> Path:
    p = tmp_path / "inv.yaml"
    p.write_text(inventory_text())
    return p


def test_no_secret_survives(original: Path) -> None:
    copy = inventory.scrubbed_copy(original)
    for secret in (TOKEN, PASSWORD, *PEM_BODY, URL_SECRET, PLAIN_SECRET, "PRIVATE KEY"):
        assert secret not in copy, secret
    assert "https://ci:***@mirror.example.com/simple" in copy  # only the password goes


def test_line_numbers_and_other_lines_kept(original: Path) -> None:
    text = original.read_text()
    copy = inventory.scrubbed_copy(original)
    assert copy.count("\n") == text.count("\n")
    changed = [i for i, (old, new) in enumerate(
        zip(text.splitlines(), copy.splitlines(), strict=True), start=1) if old != new]
    # the comment, the secret values, the PEM block's own lines (now empty); nothing else.
    # The block runs from line 13 (BEGIN) over the key's k body lines to its END line.
    k = len(PEM_BODY)
    assert changed == [1, 5, 10, 11, 12, *range(13, 15 + k), 16 + k, 17 + k, 19 + k, 22 + k]
    assert copy.splitlines()[11] == '          DEPLOY_KEY: "***"'
    assert copy.splitlines()[12:14 + k] == [""] * (k + 2)


def test_copy_is_still_the_same_inventory(original: Path, tmp_path: Path) -> None:
    p = tmp_path / "copy.yaml"
    p.write_text(inventory.scrubbed_copy(original))
    before, after = inventory.load(original), inventory.load(p)
    assert [(n.name, n.host, sorted(n.env)) for n in after.nodes] == [
        (n.name, n.host, sorted(n.env)) for n in before.nodes]
    n1, n2 = after.nodes
    assert n1.env["NCCL_DEBUG"] == "INFO" and n1.env["CUDA_VISIBLE_DEVICES"] == "0"
    for name in ("HF_TOKEN", "DB_PASSWORD", "DEPLOY_KEY", "ODD_NAME"):
        assert n1.env[name] == "***", name
    # an anchor keeps its place: the value is shared still, and hidden under every name
    # when one of them looks secret, whichever holds the anchor
    assert n1.env["SHARED"] == n2.env["WEBHOOK_SECRET"] == "***"
    assert n1.env["GH_TOKEN"] == n2.env["NOTE"] == "***"
    assert n2.env["PLAIN"] == "***"


def test_unreadable_inventory_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "inv.yaml"
    p.write_bytes(b"providers: \xff\n")
    with pytest.raises(InventoryError, match="not UTF-8"):
        inventory.scrubbed_copy(p)
