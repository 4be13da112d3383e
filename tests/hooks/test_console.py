"""`ConsoleHook` refuses settings it cannot print with when it is made.

Each of these was taken, then raised inside a run at the hook's first
line, and the hook was detached.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from turnfsm.errors import ConfigError
from turnfsm.hooks import ConsoleHook


@pytest.mark.parametrize(
    ("settings", "field", "said"),
    [
        ({"out": "stdout"}, "out", "open the file"),
        ({"out": 5}, "out", "a text stream"),
        ({"out": b"x"}, "out", "a text stream"),
        ({"out": io.BytesIO()}, "out", "this stream is binary"),
        ({"replies": "yes"}, "replies", "True or False"),
        ({"replies": None}, "replies", "True or False"),
        ({"live": 5}, "live", "True or False, or None"),
    ],
    ids=["name", "int", "bytes", "bytes stream", "replies", "replies none", "live"],
)
def test_a_bad_setting_is_refused(
    settings: dict[str, Any], field: str, said: str
) -> None:
    with pytest.raises(ConfigError, match=said) as caught:
        ConsoleHook(**settings)
    assert caught.value.field == field


def test_a_file_opened_for_bytes_is_refused(tmp_path: Path) -> None:
    with (tmp_path / "log").open("wb") as out, pytest.raises(ConfigError) as caught:
        ConsoleHook(out)  # type: ignore[arg-type]
    assert caught.value.field == "out"


def test_text_streams_are_taken(tmp_path: Path) -> None:
    with (tmp_path / "log").open("w") as out:
        ConsoleHook(out, replies=True, live=False)
    ConsoleHook(io.StringIO(), live=None)
    ConsoleHook()
