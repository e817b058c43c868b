"""The one typed settings object (ddptop.core.model.settings): every DDPTOP_* a person may set, read in one place.

(What runs processes: tests/integration/test_settings_e2e.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from ddptop.core.model.settings import USER, SettingError, Settings, settings


def test_defaults_when_nothing_is_set():
    assert settings({}) == Settings()


def test_each_setting_is_read_typed():
    s = settings({"DDPTOP_RUNS_DIR": "/r", "DDPTOP_PY_SPY": "", "DDPTOP_NATIVE_TIMEOUT": "1.5",
                  "DDPTOP_SSH": "ssh -F 'my config'", "DDPTOP_REMOTE": "~/v/bin/ddptop", "DDPTOP_STOP_GRACE": "0",
                  "DDPTOP_FILE_EVENTS": "off"})
    assert s.runs_dir == Path("/r") and s.py_spy == "" and s.native_timeout == 1.5
    assert s.ssh == ("ssh", "-F", "my config") and s.remote == "~/v/bin/ddptop"
    assert s.stop_grace == 0.0 and s.file_events is False


@pytest.mark.parametrize("name,value,says", [("DDPTOP_STOP_GRACE", "ten", "not a number of seconds"),
                                             ("DDPTOP_NATIVE_TIMEOUT", "-1", "0 or more"),
                                             ("DDPTOP_SSH", "ssh 'unclosed", "No closing quotation"),
                                             ("DDPTOP_SSH", "  ", "wants a command")])
def test_a_malformed_value_names_the_variable(name, value, says):
    with pytest.raises(SettingError, match=name) as e:
        settings({name: value})
    assert says in str(e.value)


def test_every_user_setting_is_documented_and_nothing_else_reads_the_environment_for_one():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "usage.md").read_text()
    root = Path(__file__).resolve().parents[2] / "ddptop"
    for s in USER:
        assert f"`{s.name}`" in docs, s.name
        readers = [p for p in root.rglob("*.py") if p.name != "settings.py" and f'"{s.name}"' in p.read_text()]
        assert readers == [], (s.name, readers)
