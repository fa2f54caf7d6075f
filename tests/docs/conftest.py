from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def code_blocks(page: str, lang: str) -> list[tuple[str, str]]:
    """The ``lang`` code blocks of ``docs/page``, each as (the name its first line gives it as
    a ``# NAME`` comment, or "", the block's text)."""
    out = []
    for found_lang, text in FENCE.findall((ROOT / "docs" / page).read_text()):
        if found_lang != lang:
            continue
        first = text.splitlines()[0] if text else ""
        out.append((first[2:].strip() if first.startswith("# ") else "", text))
    return out


@pytest.fixture
def blocks() -> Callable[[str, str], list[tuple[str, str]]]:
    return code_blocks
