"""The one typed settings object (ddptop.core.model.settings): every DDPTOP_* a person may set, read in one place.

(The pure parts: tests/unit/test_settings.py.)"""

from __future__ import annotations

import subprocess
import sys


def test_the_command_line_says_a_malformed_setting_before_doing_anything(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ddptop", "runs"], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DDPTOP_STOP_GRACE": "soon"})
    assert r.returncode == 2 and "DDPTOP_STOP_GRACE='soon': not a number of seconds" in r.stderr
