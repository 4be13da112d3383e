"""How counters see a tool call: its arguments as compact JSON, by the classic rule."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.profiles import sized
from tests.providers.conversations import arguments as argument_dicts
from turnfsm.messages import ToolCallPart
from turnfsm.tokens import arguments_json


@settings(max_examples=sized(300), deadline=None)
@given(argument_dicts)
def test_arguments_json_is_json_dumps_compact_with_non_ascii_kept(
    arguments: dict[str, Any],
) -> None:
    call = ToolCallPart(id="c1", name="f", arguments=arguments)
    expected = json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)
    assert arguments_json(call) == expected


def test_arguments_json_keeps_nan_and_key_order_as_json_dumps_does() -> None:
    arguments = {"z": float("nan"), "a": [1.5, -0.0, 1e300], "é": '\u6f22 "q"'}
    call = ToolCallPart(id="c1", name="f", arguments=arguments)
    assert arguments_json(call) == (
        '{"z":NaN,"a":[1.5,-0.0,1e+300],"é":"\u6f22 \\"q\\""}'
    )


@settings(max_examples=sized(500), deadline=None)
@given(st.text(), st.text())
@example("path", "src/a.py")
@example("q", 'say "hi"')
@example("q", "back\\slash")
@example("q", "line\nbreak\x7f\x1f")
@example("\u00e9", "\u6f22 \U0001f600 \u2028")
@example("", "")
def test_one_string_argument_is_json_dumps_compact(key: str, value: str) -> None:
    call = ToolCallPart(id="c1", name="f", arguments={key: value})
    expected = json.dumps({key: value}, separators=(",", ":"), ensure_ascii=False)
    assert arguments_json(call) == expected
