"""``FASTNLI_*`` settings are read when a setting is made, not at import, and a bad value names the variable."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from fastnli._env import env_choice, env_flag, env_float, env_int
from fastnli.engine import SessionConfig

THREADS_ERROR = "FASTNLI_THREADS='two' is not an integer; set it to a whole number such as 2, or unset it"


def test_import_succeeds_with_a_bad_setting_and_the_config_names_it() -> None:
    env = {**os.environ, "FASTNLI_THREADS": "two", "FASTNLI_STREAMS": "many"}
    code = ("import fastnli\n"
            "try:\n    fastnli.SessionConfig()\n"
            "except ValueError as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == THREADS_ERROR


def test_session_config_reads_the_environment_when_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTNLI_THREADS", "3")
    monkeypatch.setenv("FASTNLI_STREAMS", "2")
    assert (SessionConfig().intra_op_threads, SessionConfig().streams) == (3, 2)
    assert SessionConfig(intra_op_threads=1).intra_op_threads == 1  # an explicit value wins
    monkeypatch.setenv("FASTNLI_THREADS", "two")
    with pytest.raises(ValueError, match=f"^{re.escape(THREADS_ERROR)}$"):
        SessionConfig()
    monkeypatch.setenv("FASTNLI_THREADS", "-1")
    with pytest.raises(ValueError, match=re.escape("FASTNLI_THREADS='-1' is below 0; set it to 0 or more, or unset it")):
        SessionConfig()
    monkeypatch.setenv("FASTNLI_THREADS", " ")
    assert SessionConfig().intra_op_threads == 0  # blank is unset


def test_helpers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FASTNLI_X", raising=False)
    assert env_int("FASTNLI_X", 5) == 5 and env_float("FASTNLI_X", None) is None and env_flag("FASTNLI_X") is None
    monkeypatch.setenv("FASTNLI_X", "1.5")
    assert env_float("FASTNLI_X", 0.0) == 1.5
    with pytest.raises(ValueError, match=re.escape("FASTNLI_X='1.5' is not an integer; set it to a whole number such "
                                                   "as 7, or unset it")):
        env_int("FASTNLI_X", 7)
    monkeypatch.setenv("FASTNLI_X", "slow")
    with pytest.raises(ValueError, match=re.escape("FASTNLI_X='slow' is not a number; set it to a number such as 30, "
                                                   "or unset it")):
        env_float("FASTNLI_X", 30)
    assert env_choice("FASTNLI_Y", "a", ("a", "b")) == "a"
    monkeypatch.setenv("FASTNLI_X", "On")
    assert env_flag("FASTNLI_X") is True
