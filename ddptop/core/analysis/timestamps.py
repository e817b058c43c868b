"""When a log line says it was written (pure): the time stamps the tools of this field print.

``line_time(text)`` reads the first stamp of a line, in any of:

* PyTorch's C++ logging and glog: ``[E1126 13:56:19.368540810 ProcessGroupNCCL.cpp:632]``,
  ``[E113 11:43:02.241131296 ...]`` (c10's month is not zero-padded: January 13),
  ``E1126 13:56:19.368000 4711 torch/distributed/...``, ``W1126 ...`` (no year);
* ISO 8601 and Python logging: ``2024-11-26T13:56:19.368Z``, ``[2024-11-26 13:56:19,368]``,
  ``2024/11/26 13:56:19`` (NCCL's ``NCCL_DEBUG_TIMESTAMP_FORMAT`` default, SLURM's
  ``CANCELLED AT 2024-11-26T13:56:19``, most launchers');
* syslog and ``dmesg -T``: ``Nov 26 13:56:19``, ``[Tue Nov 26 13:56:19 2024]``.

It gives a ``Stamp``: the seconds since the epoch (UTC, the stamp's own zone ignored: stamps
of one job are compared with each other) and whether the stamp carried its year.  A stamp
without a year takes the year its caller gives (``year``: the year of the other stamps, or of
the file); ``Clock`` does that across the lines of one file, and gives an untimed line the
time of the line before it.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass

__all__ = ["Stamp", "line_time", "Clock"]

_MONTHS = {m: i for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov",
                                       "dec"), 1)}
# (glog pads the month to two digits, c10's own logging does not: "[E113 11:43:02.24 ...]" is January 13)
_GLOG = re.compile(r"(?:^|[\[:\s])[IWEF](?P<mo>1[0-2]|0[1-9]|[1-9])(?P<d>[0-3]\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)"
                   r"(?:\.(?P<f>\d+))?\b")
_ISO = re.compile(r"(?<!\d)(?P<y>(?:19|20)\d\d)[-/](?P<mo>\d\d)[-/](?P<d>\d\d)[T ](?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)"
                  r"(?:[.,](?P<f>\d+))?")
_SYSLOG = re.compile(r"\b(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +(?P<d>\d{1,2}) "
                     r"(?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:\.(?P<f>\d+))?(?: (?P<y>(?:19|20)\d\d))?\b")
_HEAD = 80  # a stamp is looked for in a line's first characters (after its prefixes), else anywhere


@dataclass(frozen=True)
class Stamp:
    month: int
    day: int
    seconds: float  # within the day
    year: int | None  # None: the stamp said no year

    def at(self, year: int | None = None) -> float | None:
        """Seconds since the epoch, with ``year`` for a stamp that has none (None if neither has one)."""
        y = self.year if self.year is not None else year
        if y is None:
            return None
        try:
            return calendar.timegm((y, self.month, self.day, 0, 0, 0)) + self.seconds
        except (ValueError, OverflowError):
            return None


def _stamp(m: re.Match, month: int, year: int | None) -> Stamp | None:
    day, h, mi, s = int(m.group("d")), int(m.group("h")), int(m.group("mi")), int(m.group("s"))
    if not (1 <= month <= 12 and 1 <= day <= 31 and h < 24 and mi < 60 and s < 61):
        return None
    frac = m.group("f")
    return Stamp(month, day, h * 3600 + mi * 60 + s + (float("0." + frac) if frac else 0.0), year)


def line_time(text: str) -> Stamp | None:
    """The first time stamp of a line (see the module), or None."""
    if not text or not any(c.isdigit() for c in text[:_HEAD * 2]):
        return None
    m = _GLOG.search(text[:_HEAD])
    if m:
        return _stamp(m, int(m.group("mo")), None)
    m = _ISO.search(text)
    if m:
        return _stamp(m, int(m.group("mo")), int(m.group("y")))
    m = _SYSLOG.search(text)
    if m:
        return _stamp(m, _MONTHS[m.group("mon").lower()], int(m.group("y")) if m.group("y") else None)
    return None


class Clock:
    """The time of each line of one file: its own stamp, else the previous
    line's; a stamp without a year takes ``year`` (the year of the stamps that
    have one, once one was seen, else the caller's default: the file's)."""

    def __init__(self, year: int | None = None):
        self.year = year
        self.last: float | None = None

    def read(self, text: str) -> float | None:
        st = line_time(text)
        if st is not None:
            if st.year is not None:
                self.year = st.year
            t = st.at(self.year)
            if t is not None:
                self.last = t
        return self.last
