"""Small formatting helpers shared by the UI's panes and tables.  Pure."""

from __future__ import annotations

GIB = 1024**3
MIB = 1024**2
NA = "n/a"


def fmt_pct(v: float | None) -> str:
    return NA if v is None else f"{v:.0f}%"


def fmt_gib(v: int | None) -> str:
    return NA if v is None else f"{v / GIB:.1f}"


def fmt_bytes(v: int | None) -> str:
    if v is None:
        return NA
    if v >= GIB:
        return f"{v / GIB:.1f} GiB"
    return f"{v / MIB:.0f} MiB"


def fmt_duration(s: float) -> str:
    """``m:ss`` style elapsed time: ``07:03``, ``1:02:03``."""
    s = max(0, int(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


def fmt_age(s: float) -> str:
    """How long ago: ``3.2s``, ``45s``, then as a duration."""
    if s < 10:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s)}s"
    return fmt_duration(s)
