"""Key material for the scrubber's tests, made when a test runs: no private key, real or
fake, is kept in the repository. `cryptography` writes the same PEM frames ssh-keygen and
OpenSSL do."""

from __future__ import annotations

import base64
import os
import secrets
import string
from typing import Literal

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa


def private_key(kind: Literal["openssh", "rsa"] = "openssh") -> str:
    """A fresh, unencrypted private key as text: `-----BEGIN OPENSSH PRIVATE KEY-----`
    (an Ed25519 key, as ssh-keygen writes it) or `-----BEGIN RSA PRIVATE KEY-----`."""
    if kind == "openssh":
        key: ed25519.Ed25519PrivateKey | rsa.RSAPrivateKey = ed25519.Ed25519PrivateKey.generate()
        fmt = serialization.PrivateFormat.OpenSSH
    else:
        key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
        fmt = serialization.PrivateFormat.TraditionalOpenSSL
    return key.private_bytes(serialization.Encoding.PEM, fmt,
                             serialization.NoEncryption()).decode().rstrip("\n")


def frame_and_body(pem: str) -> tuple[str, list[str], str]:
    """The BEGIN line, the body lines and the END line of a PEM block."""
    lines = pem.splitlines()
    return lines[0], lines[1:-1], lines[-1]


def storage_account_key() -> str:
    """A key of the shape Azure storage connection strings carry (64 random bytes, base64)."""
    return base64.b64encode(os.urandom(64)).decode()


def aws_key_pair() -> tuple[str, str]:
    """An access key id (`AKIA` and 16 of A-Z, 0-9) and a secret access key (40 characters
    of base64's alphabet) of the shapes AWS issues, made fresh: AWS's published example
    pair is what secret scanners look for first, so it is not kept here either."""
    alnum = string.ascii_uppercase + string.digits
    key_id = "AKIA" + "".join(secrets.choice(alnum) for _ in range(16))
    b64 = string.ascii_letters + string.digits + "+/"
    # a letter first (a leading / reads as a path) and a letter of each case and a digit
    # in it, as in every real secret: the scrubber's blob rule asks for them mixed
    secret = (secrets.choice(string.ascii_letters)
              + "".join(secrets.choice(b64) for _ in range(36))
              + secrets.choice(string.ascii_uppercase) + secrets.choice(string.ascii_lowercase)
              + secrets.choice(string.digits))
    return key_id, secret


def putty_key() -> str:
    """A PuTTY key file (`PuTTY-User-Key-File-3`, as puttygen writes one) around a fresh
    Ed25519 key: the public and private lines are the key's bytes in base64, the MAC is
    random hex."""
    key = ed25519.Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).split()[1]
    private = base64.b64encode(b"\x00\x00\x00\x20" + key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
        serialization.NoEncryption())).decode()
    return "\n".join(["PuTTY-User-Key-File-3: ssh-ed25519", "Encryption: none",
                      "Comment: ed25519-key-test", "Public-Lines: 2", public.decode()[:64],
                      public.decode()[64:] or "AAAA", "Private-Lines: 1", private,
                      "Private-MAC: " + secrets.token_hex(32)])


def armored(begin: str, end: str, headers: tuple[str, ...] = ()) -> str:
    """A key block of another program's frame (SSH2's `---- BEGIN SSH2 ENCRYPTED PRIVATE KEY
    ----`, PGP's `-----BEGIN PGP PRIVATE KEY BLOCK-----`) around fresh random bytes in
    base64, 64 characters a line, after its header lines."""
    body = base64.b64encode(os.urandom(300)).decode()
    return "\n".join([begin, *headers, *(body[i:i + 64] for i in range(0, len(body), 64)),
                      end])
