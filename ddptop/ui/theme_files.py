"""Theme loading: TOML files -> textual.theme.Theme.

Themes are data (``themes/*.toml`` at the repository root, or a ``themes``
folder shipped next to the package, or ``$XDG_CONFIG_HOME/ddptop/themes``).
If none can be found or read, the app silently keeps Textual's built-ins.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import tomllib
from textual.theme import Theme

DEFAULT_THEME = "ddptop-dark"
FALLBACK_THEME = "textual-dark"

_HERE = Path(__file__).resolve()


def theme_dirs() -> list[Path]:
    dirs = [
        _HERE.parents[2] / "themes",  # source checkout / editable install: <repo>/themes
        _HERE.parents[1] / "themes",  # packaged as ddptop/themes
        _HERE.parent / "themes",  # packaged as ddptop/ui/themes
    ]
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    dirs.append(Path(config) / "ddptop" / "themes")
    seen: list[Path] = []
    for d in dirs:
        if d not in seen:
            seen.append(d)
    return seen


_FIELDS = {f.name for f in dataclasses.fields(Theme)}


def theme_from_dict(d: dict) -> Theme:
    kw = {k: v for k, v in d.items() if k in _FIELDS}
    if "variables" in kw:
        kw["variables"] = {str(k): str(v) for k, v in dict(kw["variables"]).items()}
    if not kw.get("name") or not kw.get("primary"):
        raise ValueError("a theme needs at least `name` and `primary`")
    return Theme(**kw)


def load_themes(dirs: list[Path] | None = None, errors: list[str] | None = None) -> list[Theme]:
    """Every readable theme file; later folders override earlier ones by name.
    A broken file is skipped, and said in ``errors`` (its path, and the line
    for bad TOML)."""
    themes: dict[str, Theme] = {}
    for d in theme_dirs() if dirs is None else dirs:
        try:
            files = sorted(d.glob("*.toml"))
        except OSError:
            continue
        for f in files:
            try:
                with open(f, "rb") as fh:
                    theme = theme_from_dict(tomllib.load(fh))
            except (OSError, ValueError, TypeError, KeyError) as e:  # a broken theme file never stops the monitor
                if errors is not None:
                    errors.append(f"{f}: {e}")
                continue
            themes[theme.name] = theme
    return list(themes.values())
