from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.generators import histories
from turnfsm.context import (
    CompactionContext,
    CompactionProposal,
    ContextCompactor,
    mark_replacements,
)
from turnfsm.context._digest import ToolResultDigest, digest_line, digest_results
from turnfsm.context._pairs import pair_tool_traffic, result_problem
from turnfsm.core._lines import CompactReason
from turnfsm.errors import ConfigError
from turnfsm.messages import JSONValue, Message, ToolCallPart, ToolResultPart
from turnfsm.testing import check_compactor
from turnfsm.tokens import HeuristicTokenCounter

COUNTER = HeuristicTokenCounter()
BIG = "x" * 2001  # one character over the default `min_chars`


def call(name: str, call_id: str = "tc_1", **arguments: JSONValue) -> ToolCallPart:
    return ToolCallPart(id=call_id, name=name, arguments=arguments)


def result(
    content: str, *, call_id: str = "tc_1", is_error: bool = False
) -> ToolResultPart:
    return ToolResultPart(call_id=call_id, content=content, is_error=is_error)


def lines(n: int, text: str = "line") -> str:
    return "\n".join(f"{text} {i}" for i in range(n))


# -- digest_line ------------------------------------------------------------

LINE_CASES = [
    (
        call("read_file", path="notes.md"),
        result("0123456789"),
        "[read_file] read notes.md (10 chars)",
    ),
    (
        call("read_file", file="a.txt"),
        result("é" * 10),
        "[read_file] read a.txt (10 chars)",
    ),
    (
        call("read_file", filename="b.txt"),
        result("x"),
        "[read_file] read b.txt (1 char)",
    ),
    (
        call("read_file", path="gone.md"),
        result("no such file", is_error=True),
        "[read_file] read gone.md (12 chars), error",
    ),
    (
        call("write_file", path="notes.md", content="hello"),
        result("ok, wrote it"),
        "[write_file] wrote notes.md (5 chars)",
    ),
    (
        call("create_file", path="new.md", text="abc"),
        result("created"),
        "[create_file] wrote new.md (3 chars)",
    ),
    (
        call("write_file", path="notes.md"),
        result("written!"),
        "[write_file] wrote notes.md (8 chars)",
    ),
    (
        call("edit_file", path="notes.md", old="a", new="b"),
        result("patched"),
        "[edit_file] edited notes.md",
    ),
    (
        call("edit_file", path="notes.md"),
        result("no match", is_error=True),
        "[edit_file] edited notes.md, error",
    ),
    (
        call("execute_cmd", cmd="cargo build"),
        result(lines(47)),
        "[execute_cmd] ran `cargo build` → exit 0, 47 lines output",
    ),
    (
        call("run_command", command="make test"),
        result("compiling\nFAILED\nexit code: 2\n"),
        "[run_command] ran `make test` → exit 2, 3 lines output",
    ),
    (
        call("shell", cmd="false"),
        result("Command failed with exit status 1"),
        "[shell] ran `false` → exit 1, 1 line output",
    ),
    (
        call("bash", command="ls /nope"),
        result("ls: cannot access '/nope'\nreturncode=2"),
        "[bash] ran `ls /nope` → exit 2, 2 lines output",
    ),
    (
        call("bash", command="./run.sh"),
        result("step 1\nexit 3\nretrying\nExited with code 0"),
        "[bash] ran `./run.sh` → exit 0, 4 lines output",
    ),
    (
        call("bash", command="crash"),
        result("Segmentation fault", is_error=True),
        "[bash] ran `crash` → exit ?, 1 line output",
    ),
    (
        call("bash", command="true"),
        result(""),
        "[bash] ran `true` → exit 0, 0 lines output",
    ),
    (
        call("bash", command=["git", "status"]),
        result("clean\n"),
        "[bash] ran `git status` → exit 0, 1 line output",
    ),
    (
        call("bash", command="cat <<EOF\nhi\nEOF"),
        result("hi"),
        "[bash] ran `cat <<EOF hi EOF` → exit 0, 1 line output",
    ),
    (
        call("list_dir", path="src/"),
        result(lines(12) + "\n\n"),
        "[list_dir] listed src/ (12 entries)",
    ),
    (
        call("ls", dir="docs"),
        result("index.md\n"),
        "[ls] listed docs (1 entry)",
    ),
    (
        call("search", pattern="TODO"),
        result(lines(5, "a.py:1: TODO")),
        "[search] searched 'TODO' (5 matches)",
    ),
    (
        call("grep", query="fixme"),
        result("one hit"),
        "[grep] searched 'fixme' (1 match)",
    ),
    (
        call("find", regex="x+"),
        result("", is_error=True),
        "[find] searched 'x+' (0 matches), error",
    ),
    (
        call("web_fetch", url="https://example.com/a"),
        result("<html>" + "x" * 94),
        "[web_fetch] fetched https://example.com/a (100 chars)",
    ),
    (
        call("http_get", url="https://x.test"),
        result("503", is_error=True),
        "[http_get] fetched https://x.test (3 chars), error",
    ),
    (
        call("lookup", id=42),
        result(("y" * 66 + "\n") * 11 + "y" * 63),
        "[lookup] (id=42) returned 800 chars, 12 lines",
    ),
    (
        call("lookup", id="abc", other="ignored"),
        result("a\nb\n"),
        "[lookup] (id=abc) returned 4 chars, 2 lines",
    ),
    (
        call("lookup", query="q" * 60),
        result("ab"),
        "[lookup] returned 2 chars, 1 line",
    ),
    (
        call("lookup"),
        result("boom", is_error=True),
        "[lookup] returned 4 chars, 1 line, error",
    ),
    (
        call("read_file", limit=10),
        result("abc"),
        "[read_file] (limit=10) returned 3 chars, 1 line",
    ),
    (
        call("READ_FILE", path="Notes.md"),
        result("abc"),
        "[READ_FILE] read Notes.md (3 chars)",
    ),
    (
        None,
        result("x" * 800 + "\n" * 11, call_id="tc_7"),
        "[tool tc_7] returned 811 chars, 11 lines",
    ),
]


@pytest.mark.parametrize(
    ("tool_call", "tool_result", "expected"),
    LINE_CASES,
    ids=[f"{c.name if c else 'no-call'}-{i}" for i, (c, _, _) in enumerate(LINE_CASES)],
)
def test_digest_line(
    tool_call: ToolCallPart | None, tool_result: ToolResultPart, expected: str
) -> None:
    assert digest_line(tool_call, tool_result) == expected


def test_long_command_is_clipped_to_80_chars() -> None:
    cmd = "echo " + "a" * 200

    line = digest_line(call("bash", command=cmd), result("ok"))

    assert line == f"[bash] ran `{cmd[:79]}…` → exit 0, 1 line output"


@pytest.mark.parametrize(
    "arguments",
    [
        {"command": "x\n" * 300},
        {"path": "\u2028\x1c\x85\r\n\t\x00" * 50},
        {"id": "\n" * 30},
        {"n\ne\nw": "l\ni\nn\ne"},
    ],
    ids=["command", "separators", "blank", "key"],
)
@pytest.mark.parametrize(
    "name", ["bash", "read_file", "search", "web_fetch", "lookup", "x\n" * 100]
)
def test_every_digest_is_one_short_line(
    name: str, arguments: dict[str, JSONValue]
) -> None:
    tool_call = ToolCallPart(id="i\n" * 100, name=name, arguments=arguments)
    tool_result = result("exit 12345\n" * 500, call_id=tool_call.id, is_error=True)

    for line in (
        digest_line(tool_call, tool_result),
        digest_line(None, tool_result),
    ):
        assert len(line) <= 200
        assert line.splitlines() == [line]
        assert line.isprintable()


# -- digest_results -----------------------------------------------------------


def turn(n: int, content: str, *, name: str = "read_file") -> list[Message]:
    """A user question, a call, its result and an answer (ids end in `n`)."""
    return [
        Message.user(f"q{n}", id=f"u{n}"),
        Message.assistant(
            tool_calls=[call(name, f"c{n}", path=f"f{n}.txt")], id=f"a{n}"
        ),
        Message.tool_result(f"c{n}", content, id=f"t{n}", metadata={"k": "v"}),
        Message.assistant(f"done {n}", id=f"d{n}"),
    ]


def contents(messages: Sequence[Message]) -> list[str]:
    return [p.content for m in messages for p in m.tool_results]


def test_old_big_result_is_digested_and_the_rest_kept() -> None:
    messages = [Message.system("task", id="sys"), *turn(1, BIG), *turn(2, BIG)]

    out = digest_results(messages)

    assert contents(out) == ["[read_file] read f1.txt (2001 chars)", BIG]
    assert len(out) == len(messages)
    digested = out[3]
    assert digested.id == "t1"
    assert digested.role is messages[3].role
    assert digested.metadata == {"k": "v"}
    assert digested.tool_results[0].call_id == "c1"
    assert all(
        a is b for i, (a, b) in enumerate(zip(out, messages, strict=True)) if i != 3
    )


@pytest.mark.parametrize(
    ("content", "is_digested"),
    [
        ("x" * 2000, False),
        ("x" * 2001, True),
        ("é" * 2000, False),
        ("日" * 2000, False),
        ("日" * 2001, True),
    ],
    ids=["at-min", "over-min", "accents-at-min", "cjk-at-min", "cjk-over-min"],
)
def test_min_chars_counts_characters(content: str, is_digested: bool) -> None:
    messages = [*turn(1, content), *turn(2, "")]

    out = digest_results(messages)

    assert (out[2] is not messages[2]) == is_digested
    expected = f"[read_file] read f1.txt ({len(content)} chars)"
    assert contents(out)[0] == (expected if is_digested else content)


def test_min_chars_knob_moves_the_boundary() -> None:
    messages = [*turn(1, "x" * 11), *turn(2, "")]

    assert digest_results(messages, min_chars=11) == tuple(messages)
    assert contents(digest_results(messages, min_chars=10))[0] == (
        "[read_file] read f1.txt (11 chars)"
    )


@pytest.mark.parametrize(
    ("keep", "digested"),
    [(0, [1, 2, 3]), (1, [1, 2]), (2, [1]), (3, []), (4, [])],
)
def test_keep_recent_turns(keep: int, digested: list[int]) -> None:
    messages = [*turn(1, BIG), *turn(2, BIG), *turn(3, BIG)]

    out = digest_results(messages, keep_recent_turns=keep)

    assert contents(out) == [
        f"[read_file] read f{n}.txt (2001 chars)" if n in digested else BIG
        for n in (1, 2, 3)
    ]


def test_messages_before_the_first_user_message_are_the_oldest_turn() -> None:
    preamble = [
        Message.system("task", id="sys"),
        Message.assistant(tool_calls=[call("lookup", "c0", id=1)], id="a0"),
        Message.tool_result("c0", BIG, id="t0"),
    ]

    alone = digest_results(preamble)
    with_turn = digest_results([*preamble, *turn(1, BIG)])

    assert alone == tuple(preamble)  # the only turn is the newest
    assert contents(with_turn) == ["[lookup] (id=1) returned 2001 chars, 1 line", BIG]


def test_reused_call_ids_pair_with_the_latest_call() -> None:
    messages = [
        Message.user("q1", id="u1"),
        Message.assistant(tool_calls=[call("read_file", "c", path="a.md")], id="a1"),
        Message.tool_result("c", BIG, id="t1"),
        Message.assistant(tool_calls=[call("bash", "c", command="make")], id="a2"),
        Message.tool_result("c", BIG + "\nexit code: 4", id="t2"),
        Message.user("q2", id="u2"),
    ]

    out = digest_results(messages)

    assert contents(out) == [
        "[read_file] read a.md (2001 chars)",
        "[bash] ran `make` → exit 4, 2 lines output",
    ]


def test_parallel_results_are_digested_per_part() -> None:
    calls = [call("read_file", "c1", path="a"), call("read_file", "c2", path="b")]
    parts = [result("small", call_id="c1"), result(BIG, call_id="c2")]
    messages = [
        Message.user("q1", id="u1"),
        Message.assistant(tool_calls=calls, id="a1"),
        Message(role="tool", parts=parts, id="t1"),
        Message.user("q2", id="u2"),
    ]

    out = digest_results(messages)

    assert out[2].parts[0] is parts[0]
    assert out[2].parts[1] == result("[read_file] read b (2001 chars)", call_id="c2")


def test_result_with_no_call_in_view() -> None:
    messages = [
        Message.tool_result("tc_9", BIG, is_error=True, id="t0"),
        Message.user("q1", id="u1"),
    ]

    out = digest_results(messages)

    assert out[0].tool_results == (
        result(
            "[tool tc_9] returned 2001 chars, 1 line, error",
            call_id="tc_9",
            is_error=True,
        ),
    )


@pytest.mark.parametrize("min_chars", [1, 10, 150, 2000])
def test_digesting_twice_changes_nothing_more(min_chars: int) -> None:
    messages = [
        *turn(1, BIG),
        *turn(2, BIG, name="bash"),
        *turn(3, BIG, name="lookup"),
        Message.tool_result("lone", BIG, id="t-lone"),
        *turn(4, BIG),
    ]

    once = digest_results(messages, min_chars=min_chars)
    twice = digest_results(once, min_chars=min_chars)

    assert once != tuple(messages)
    assert twice == once
    assert all(a is b for a, b in zip(twice, once, strict=True))


def test_nothing_to_digest_returns_the_same_messages() -> None:
    messages = [*turn(1, "small"), *turn(2, BIG)]

    out = digest_results(messages)

    assert all(a is b for a, b in zip(out, messages, strict=True))
    assert digest_results([]) == ()


@pytest.mark.parametrize(
    ("knob", "value"),
    [
        ("min_chars", 0),
        ("min_chars", -1),
        ("min_chars", True),
        ("min_chars", "3"),
        ("keep_recent_turns", -1),
        ("keep_recent_turns", True),
        ("keep_recent_turns", "3"),
        ("keep_recent_turns", 1.0),
    ],
)
def test_bad_knobs_raise_config_error(knob: str, value: object) -> None:
    with pytest.raises(ConfigError) as compactor_error:
        ToolResultDigest(**{knob: value})  # type: ignore[arg-type]  # on purpose
    with pytest.raises(ConfigError) as function_error:
        digest_results([], **{knob: value})  # type: ignore[arg-type]  # on purpose

    for error in (compactor_error.value, function_error.value):
        assert error.field == knob
        assert error.value == value


def test_zero_recent_turns_is_allowed() -> None:
    assert ToolResultDigest(keep_recent_turns=0).keep_recent_turns == 0


# -- ToolResultDigest -----------------------------------------------------------


def compact(
    messages: Sequence[Message], compactor: ToolResultDigest
) -> CompactionProposal:
    ctx = CompactionContext(
        tokens_before=COUNTER.count(messages),
        reason=CompactReason.THRESHOLD_EXCEEDED,
        context_window=1_000,
        turn=3,
        counter=COUNTER,
    )

    async def go() -> CompactionProposal:
        return await compactor.compact(messages, 0, ctx)

    return anyio.run(go)


def test_compactor_digests_and_recounts() -> None:
    messages = [*turn(1, BIG), *turn(2, BIG)]

    outcome = compact(messages, ToolResultDigest())

    # Each digest names its message, whose original the log keeps.
    assert outcome.messages == mark_replacements(messages, digest_results(messages))
    assert outcome.tokens_before == COUNTER.count(messages)
    assert outcome.tokens_after == COUNTER.count(outcome.messages)
    assert outcome.tokens_after < outcome.tokens_before
    assert not outcome.is_failed


def test_compactor_with_nothing_to_digest_is_unchanged() -> None:
    messages = [*turn(1, BIG), *turn(2, BIG)]

    outcome = compact(messages, ToolResultDigest(keep_recent_turns=2))

    assert outcome == CompactionProposal.unchanged(messages, COUNTER.count(messages))
    assert all(a is b for a, b in zip(outcome.messages, messages, strict=True))


def test_compactor_keeps_the_contract() -> None:
    compactor = ToolResultDigest(min_chars=1, keep_recent_turns=0)

    assert isinstance(compactor, ContextCompactor)
    anyio.run(check_compactor, compactor)


# -- properties ---------------------------------------------------------------


@settings(deadline=None)
@given(
    messages=histories(),
    min_chars=st.integers(1, 4),  # generated results are short
    keep=st.integers(0, 3),
)
def test_digest_keeps_count_pairs_and_is_idempotent(
    messages: list[Message], min_chars: int, keep: int
) -> None:
    out = digest_results(messages, min_chars=min_chars, keep_recent_turns=keep)

    assert len(out) == len(messages)
    assert result_problem(out, messages) == result_problem(messages, messages)
    assert pair_tool_traffic(out) == pair_tool_traffic(messages)
    for new, old in zip(out, messages, strict=True):
        assert (new.id, new.role, len(new.parts)) == (old.id, old.role, len(old.parts))
        if new is not old:
            assert [(p.call_id, p.is_error) for p in new.tool_results] == [
                (p.call_id, p.is_error) for p in old.tool_results
            ]
    again = digest_results(out, min_chars=min_chars, keep_recent_turns=keep)
    assert again == out
    assert all(a is b for a, b in zip(again, out, strict=True))
