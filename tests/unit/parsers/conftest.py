from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture
def real() -> Callable[[str], str]:
    """Text of a capture from the 2x H200 host."""
    return lambda name: (FIXTURES / "h200x2" / "commands" / name).read_text()


@pytest.fixture
def synth() -> Callable[[str], str]:
    return lambda name: (FIXTURES / "synthetic" / name).read_text()


@pytest.fixture
def public() -> Callable[[str], str]:
    """Text of an output published by someone else (tests/fixtures/public/README.md)."""
    return lambda name: (FIXTURES / "public" / name).read_text()
