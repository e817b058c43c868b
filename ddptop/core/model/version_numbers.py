"""The one version parser: ``2.29.1-1`` -> (2, 29, 1), ``2.4.0+cu121`` -> (2, 4, 0).

NCCL, torch, CUDA and the driver write their versions as a dotted release
followed by a build or local part (``-1``, ``+cuda12.8``, ``a0``); only the
dotted release counts.
"""

from __future__ import annotations

import re

_RELEASE = re.compile(r"\s*[vV]?(\d+(?:\.\d+)*)")


def version_tuple(v: str | None) -> tuple[int, ...]:
    """The dotted release at the start of ``v`` as numbers; () when there is none."""
    m = _RELEASE.match(v or "")
    return tuple(int(x) for x in m.group(1).split(".")) if m else ()


def version_cmp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """-1, 0 or 1, as a < b, a == b, a > b; missing trailing parts count as 0."""
    n = max(len(a), len(b))
    a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return (a > b) - (a < b)
