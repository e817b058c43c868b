"""Step numbers from log lines (a minimal parser; richer formats build on it)."""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_STEP = re.compile(r"\b(?:step|iter|iteration)\b\s*[:=#]?\s*\[?\s*(\d+)", re.IGNORECASE)


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text) if "\x1b" in text else text


def parse_step(text: str) -> int | None:
    """The training step a line reports, or None (``step 12 loss 0.3`` -> 12)."""
    if "tep" not in text and "ter" not in text and "TEP" not in text and "TER" not in text:
        return None
    m = _STEP.search(strip_ansi(text))
    return int(m.group(1)) if m else None
