from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import functools
import json
import re
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Literal

import anyio
import anyio.lowlevel
import attrs
import pydantic
import pytest

from turnfsm import Agent
from turnfsm.driver import Driver, RetryPolicy, RunControl, Tool, _tools, function_tool
from turnfsm.driver._tools import run_tool_call, tools_by_name
from turnfsm.errors import ConfigError, ProviderError, ToolError
from turnfsm.messages import Message, ToolCallPart
from turnfsm.persistence import Session
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import FakeModelClient, ScriptedModel, reply, tool_call


def search(
    query: str,
    limit: int = 10,
    mode: Literal["fast", "deep"] = "fast",
    tags: list[str] | None = None,
    weights: dict[str, float] | None = None,
    exact: bool = False,
    score: float = 0.5,
) -> list[str]:
    """Search the notes.

    Longer text that is not part of the summary.

    Args:
        query: what to look for.
        limit: the most results
            to return.
        mode: how hard to look.
        tags (list[str]): only notes with these tags.

    Returns:
        Matching note names.
    """
    return [query] * min(limit, 2)


def test_schema_comes_from_the_signature_and_the_docstring() -> None:
    tool = function_tool(search)
    assert (tool.name, tool.description) == ("search", "Search the notes.")
    params = tool.parameters
    assert params["required"] == ["query"]
    assert params["additionalProperties"] is False
    props = params["properties"]
    assert props["query"] == {"type": "string", "description": "what to look for."}
    assert props["limit"] == {
        "type": "integer",
        "description": "the most results to return.",
    }
    assert props["mode"] == {
        "enum": ["fast", "deep"],
        "description": "how hard to look.",
    }
    assert props["tags"]["anyOf"] == [
        {"type": "array", "items": {"type": "string"}},
        {"type": "null"},
    ]
    assert props["weights"] == {
        "anyOf": [
            {"type": "object", "additionalProperties": {"type": "number"}},
            {"type": "null"},
        ]
    }
    assert props["exact"] == {"type": "boolean"}
    assert props["score"] == {"type": "number"}
    assert tool.schema.name == "search"


def test_decorator_with_options_renames_and_redescribes() -> None:
    @function_tool(name="lookup", description="Look things up.")
    def f(q: str) -> str:
        return q

    assert isinstance(f, Tool)
    assert (f.name, f.description) == ("lookup", "Look things up.")


def _positional_only(x: int, /) -> str:
    """Every call would raise TypeError: a tool is called with keywords.

    Args:
        x: a number.
    """
    return str(x)


@pytest.mark.parametrize(
    ("fn", "reason"),
    [
        (lambda x: x, "needs a type annotation"),
        (lambda *args: args, "cannot be described"),
        (_positional_only, "parameter 'x' is positional-only"),
    ],
    ids=["unannotated", "varargs", "positional-only"],
)
def test_undescribable_functions_raise_tool_error(fn: object, reason: str) -> None:
    with pytest.raises(ToolError, match=reason):
        Tool.from_function(fn)  # type: ignore[arg-type]


def test_unsupported_annotations_and_bad_names_raise_tool_error() -> None:
    def f(x: object) -> str:
        return ""

    with pytest.raises(ToolError, match="unsupported annotation"):
        Tool.from_function(f)
    with pytest.raises(ToolError, match="1-64"):
        Tool.from_function(search, name="no spaces allowed")
    with pytest.raises(ToolError, match="1-64"):  # not the function's name instead
        Tool.from_function(search, name="")


def test_a_function_whose_name_is_no_tool_name_is_told_how_to_name_it() -> None:
    # It was told only "a tool name is 1-64 of A-Z a-z 0-9 _ -", about a name
    # it never gave.
    def prix_payé(article: str) -> str:
        return article

    with pytest.raises(ToolError) as caught:
        Tool.from_function(prix_payé)
    assert str(caught.value) == (
        "tool 'prix_payé': a tool name is 1-64 of A-Z a-z 0-9 _ -, and this is "
        "the function's name: give the tool one, "
        "function_tool(fn, name='...') or Tool.from_function(fn, name='...')"
    )
    with pytest.raises(ToolError, match="and this is the function's name"):
        Tool.from_function(lambda: "")


_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("name", 5, "invalid Tool.name=5: expected a string"),
        ("description", None, "invalid Tool('t').description=None: expected a string"),
        ("description", 5, "invalid Tool('t').description=5: expected a string"),
        ("fn", None, "invalid Tool('t').fn=None: expected the function the tool runs"),
        ("fn", "search", "invalid Tool('t').fn='search': expected the function"),
        ("structure", "x", "invalid Tool('t').structure='x': expected a callable"),
        ("in_subprocess", "yes", "invalid Tool('t').in_subprocess='yes': expected"),
    ],
)
def test_a_tool_of_the_wrong_types_is_refused_when_it_is_made(
    field: str, value: object, message: str
) -> None:
    fields: dict[str, Any] = {
        "name": "t",
        "description": "d",
        "parameters": _PARAMETERS,
        "fn": search,
    }
    with pytest.raises(ConfigError) as caught:
        Tool(**{**fields, field: value})
    assert str(caught.value).startswith(message)


def test_function_tool_refuses_what_is_not_a_function_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"invalid fn='search': expected a function"):
        function_tool("search")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"Tool\('search'\).description=\['x'\]"):
        function_tool(search, description=["x"])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"invalid Tool.name=5"):
        function_tool(search, name=5)  # type: ignore[arg-type]


def undocumented(city: str) -> str:
    return city


@pytest.mark.parametrize("description", [0, False, [], "", "   ", "\n"], ids=repr)
@pytest.mark.parametrize("fn", [search, undocumented], ids=["documented", "bare"])
def test_a_description_not_a_string_or_blank_is_refused_naming_it(
    fn: Callable[..., Any], description: object
) -> None:
    # A falsy one was replaced by the docstring (5 was refused), and a
    # blank one reached the model as the tool's only explanation.
    with pytest.raises(ConfigError) as caught:
        function_tool(fn, description=description)  # type: ignore[call-overload]
    field = f"Tool({fn.__name__!r}).description"
    assert (caught.value.field, caught.value.value) == (field, description)
    assert "not a blank one" in str(caught.value)
    with pytest.raises(ConfigError) as made:
        Tool(
            name="t",
            description=description,  # type: ignore[arg-type]
            parameters=_PARAMETERS,
            fn=search,
        )
    assert made.value.field == "Tool('t').description"


def test_no_description_is_the_docstrings_summary_or_the_name() -> None:
    assert function_tool(search).description == "Search the notes."
    assert function_tool(search, description=None).description == "Search the notes."
    assert function_tool(undocumented).description == "undocumented"


def test_duplicate_tool_names_are_rejected_saying_how_to_rename() -> None:
    with pytest.raises(ToolError, match="registered twice") as caught:
        tools_by_name([search, search])

    assert "function_tool(search, name=...)" in str(caught.value)
    assert "list it once" in str(caught.value)


@pytest.mark.anyio
async def test_invoke_checks_arguments_and_serialises_results() -> None:
    tools = tools_by_name([search])
    ok = await run_tool_call(
        ToolCallPart(id="c1", name="search", arguments={"query": "x", "limit": 5}),
        tools,
        limit=5,
    )
    assert ok.tool_results[0].content == '["x", "x"]'
    bad = await run_tool_call(
        ToolCallPart(id="c2", name="search", arguments={"nope": 1}), tools, limit=5
    )
    result = bad.tool_results[0]
    assert result.is_error
    assert "- query: missing (required)" in result.content
    assert "- nope: unexpected (not a parameter of this tool)" in result.content


@pytest.mark.anyio
async def test_sync_tools_run_in_a_worker_thread() -> None:
    import threading

    main = threading.get_ident()

    def where() -> str:
        """Say where it runs."""
        return "worker" if threading.get_ident() != main else "loop"

    out = await run_tool_call(
        ToolCallPart(id="c", name="where"), tools_by_name([where]), limit=None
    )
    assert out.tool_results[0].content == "worker"


def test_a_function_is_read_once_however_many_agents_wrap_it() -> None:
    def search(query: str, limit: int = 5) -> str:
        """Search the docs.

        Args:
            query: what to look for.
            limit: how many results.
        """
        return query

    first = Tool.from_function(search)
    again = Tool.from_function(search, name="find", description="Find.")
    assert again.parameters is first.parameters
    assert (again.name, again.description) == ("find", "Find.")
    assert first.description == "Search the docs."


def test_functions_made_alike_are_each_read_for_themselves() -> None:
    # Closures of one definition share their code, not their annotations.
    def make(kind: type) -> Callable[..., str]:
        def value(x: object) -> str:
            """Echo."""
            return str(x)

        value.__annotations__ = {"x": kind, "return": str}
        return value

    numbers, words = Tool.from_function(make(int)), Tool.from_function(make(str))
    assert numbers.parameters["properties"]["x"] == {"type": "integer"}
    assert words.parameters["properties"]["x"] == {"type": "string"}


def test_a_function_that_cannot_be_described_is_refused_every_time() -> None:
    def bad(x) -> str:  # type: ignore[no-untyped-def]
        return str(x)

    for _ in range(2):
        with pytest.raises(ToolError, match="needs a type annotation"):
            Tool.from_function(bad)


async def _swallows(seconds: float) -> str:
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        pass  # a bug of its own: cancellation is never swallowed
    return "late"


@pytest.mark.anyio
async def test_a_tool_that_answers_past_its_timeout_timed_out() -> None:
    async def wait(seconds: float) -> str:
        """Wait.

        Args:
            seconds: how long.
        """
        return await _swallows(seconds)

    tools = tools_by_name([wait])
    call = ToolCallPart(id="c1", name="wait", arguments={"seconds": 5})
    result = (await run_tool_call(call, tools, limit=0.2)).tool_results[0]
    assert (result.content, result.is_error) == (
        "tool 'wait' timed out after 0.2s",
        True,
    )


@pytest.mark.anyio
async def test_a_reply_past_the_model_timeout_timed_out_and_is_asked_again() -> None:
    calls = 0

    async def handle(_request: ModelRequest) -> ModelResponse:
        nonlocal calls
        calls += 1
        if calls == 1:
            await _swallows(5)
            return ModelResponse(message=Message.assistant("late"))
        return ModelResponse(message=Message.assistant("in time"))

    driver = Driver(model=FakeModelClient(handle), model_timeout=0.2)
    result = await driver.run("hello")
    assert (result.outcome, result.text, calls) == ("done", "in time", 2)


class _Hanging:
    """A model client that never answers."""

    def __init__(self, model: str | None = None) -> None:
        if model is not None:
            self.model = model

    async def complete(self, _request: ModelRequest) -> ModelResponse:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


_SETTING = " - model_timeout=0.2 s per attempt; raise it to wait longer"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("model", "message"),
    [
        (_Hanging(), "model _Hanging timed out after 0.2s" + _SETTING),
        (_Hanging("gpt-test"), "model 'gpt-test' timed out after 0.2s" + _SETTING),
    ],
)
async def test_a_model_timeout_says_what_timed_out_and_after_how_long(
    model: _Hanging, message: str
) -> None:
    once = RetryPolicy(max_attempts=1)
    result = await Driver(model=model, model_timeout=0.2, retry=once).run("hi")
    assert result.outcome == "failed"
    assert isinstance(result.error, ProviderError)
    assert result.error.message == message


class Colour(enum.Enum):
    RED = "red"


@attrs.frozen
class Point:
    x: int
    colour: Colour


@dataclasses.dataclass
class Box:
    corner: Point
    tags: frozenset[str]
    day: datetime.date


class Price(pydantic.BaseModel):
    amount: float
    day: datetime.date


@pytest.mark.parametrize(
    ("result", "text"),
    [
        (Point(1, Colour.RED), '{"x": 1, "colour": "red"}'),
        (
            Box(Point(2, Colour.RED), frozenset({"b", "a"}), datetime.date(2025, 5, 2)),
            '{"corner": {"x": 2, "colour": "red"}, "tags": ["a", "b"], '
            '"day": "2025-05-02"}',
        ),
        (
            Price(amount=2.5, day=datetime.date(2025, 5, 2)),
            '{"amount": 2.5, "day": "2025-05-02"}',
        ),
        ({1, "a"}, None),  # a set that cannot be sorted is still a list
        # What subprocess.check_output returns: was "\"b'a.txt\\nb.txt\\n'\"".
        (b"a.txt\nb.txt\n", "a.txt\nb.txt\n"),
        ({"out": b"caf\xc3\xa9 \xff"}, '{"out": "caf\u00e9 \ufffd"}'),
    ],
    ids=["attrs", "dataclass", "pydantic", "mixed-set", "bytes", "bytes-inside"],
)
@pytest.mark.anyio
async def test_a_result_that_is_not_a_string_is_json_of_its_fields(
    result: object, text: str | None
) -> None:
    def give() -> object:
        """Give the value."""
        return result

    content = await function_tool(give).invoke({})
    if text is None:
        assert sorted(json.loads(content), key=str) == [1, "a"]
    else:
        assert content == text


def _cycle() -> dict[str, object]:
    node: dict[str, object] = {"name": "a"}
    node["self"] = node
    return node


@pytest.mark.parametrize(
    ("result", "text"),
    [
        ({(1, 2): "a"}, "{(1, 2): 'a'}"),
        (_cycle(), "{'name': 'a', 'self': {...}}"),
    ],
    ids=["tuple-keys", "cycle"],
)
@pytest.mark.anyio
async def test_a_result_json_cannot_hold_is_its_text_not_a_failure(
    result: object, text: str
) -> None:
    # The tool had run, and the model was told it failed ("TypeError: keys
    # must be str, ...", "ValueError: Circular reference detected"): it
    # might run it again.
    def give() -> object:
        """Give the value."""
        return result

    tools = tools_by_name([give])
    call = ToolCallPart(id="c", name="give", arguments={})
    (done,) = (await run_tool_call(call, tools, limit=None)).tool_results
    assert (done.content, done.is_error) == (text, False)


def _repeat(text: str, times: int) -> str:
    """Repeat a text.

    Args:
        times: how many times.
    """
    return text * times


class _Account:
    """A user's account, given by the program, never by the model."""

    def __init__(self, user: str) -> None:
        self.user = user


def _delete_note(title: str, account: _Account, owner: str = "ada") -> str:
    """Delete a note.

    Args:
        title: the note's title.
        account: the account it is in.
        owner: whose note it is.
    """
    return f"deleted {title!r} of {owner} in {account.user}'s account"


@pytest.mark.anyio
async def test_a_partials_keyword_is_fixed_and_not_shown_to_the_model() -> None:
    # A keyword given to the partial stayed a parameter: one of a class
    # (a database, an account) was refused as an unsupported annotation, and
    # one of a JSON type was offered to the model, which could change it.
    fn = functools.partial(_delete_note, account=_Account("ada"), owner="ada")
    tools = tools_by_name([fn])
    tool = tools["_delete_note"]
    assert tool.parameters["properties"] == {
        "title": {"type": "string", "description": "the note's title."}
    }
    assert tool.parameters["required"] == ["title"]
    done = await run_tool_call(
        ToolCallPart(id="c", name="_delete_note", arguments={"title": "todo"}),
        tools,
        limit=None,
    )
    assert done.tool_results[0].content == "deleted 'todo' of ada in ada's account"
    other = ToolCallPart(
        id="d", name="_delete_note", arguments={"title": "todo", "owner": "bob"}
    )
    refused = (await run_tool_call(other, tools, limit=None)).tool_results[0]
    assert refused.is_error
    assert "- owner: unexpected (not a parameter of this tool)" in refused.content


class _Counter:
    """Count letters."""

    def __call__(self, text: str) -> int:
        """Count the letters of a text."""
        return len(text)


class _Undocumented:
    """Add one."""

    async def __call__(self, n: int) -> int:
        return n + 1


@pytest.mark.anyio
async def test_a_partial_is_described_by_its_function_with_the_arguments_left() -> None:
    tools = tools_by_name([functools.partial(_repeat, "ab")])
    tool = tools["_repeat"]
    assert tool.description == "Repeat a text."
    assert tool.parameters["properties"] == {
        "times": {"type": "integer", "description": "how many times."}
    }
    assert tool.parameters["required"] == ["times"]
    out = await run_tool_call(
        ToolCallPart(id="c", name="_repeat", arguments={"times": 2}), tools, limit=None
    )
    assert out.tool_results[0].content == "abab"


@pytest.mark.anyio
async def test_a_callable_instance_is_described_by_its_class_and_call() -> None:
    tools = tools_by_name([_Counter(), _Undocumented()])
    assert tools["_Counter"].description == "Count the letters of a text."
    assert tools["_Undocumented"].description == "Add one."  # the class's docstring
    assert list(tools["_Counter"].parameters["properties"]) == ["text"]
    counted = await run_tool_call(
        ToolCallPart(id="c", name="_Counter", arguments={"text": "abc"}),
        tools,
        limit=None,
    )
    added = await run_tool_call(
        ToolCallPart(id="d", name="_Undocumented", arguments={"n": 1}),
        tools,
        limit=None,
    )
    assert (counted.tool_results[0].content, added.tool_results[0].content) == (
        "3",
        "2",
    )


def test_an_annotation_naming_nothing_is_refused_naming_the_parameter() -> None:
    def lookup(key: str, kind: NotDefined) -> str:  # type: ignore[name-defined] # noqa: F821
        return key

    with pytest.raises(ToolError) as caught:
        Tool.from_function(lookup)
    assert caught.value.tool == "lookup"
    assert "parameter 'kind'" in str(caught.value)
    assert "'NotDefined'" in str(caught.value)


@pytest.mark.anyio
async def test_a_tool_that_changes_its_arguments_changes_a_copy() -> None:
    def tag(labels: dict[str, list[str]], extra: Any) -> str:
        """Tag the labels.

        Args:
            labels: the labels.
            extra: anything.
        """
        labels["names"].append("tagged")
        extra["names"].append("tagged")
        return json.dumps([labels, extra])

    async def raw(labels: Any) -> str:
        labels["names"].append("tagged")
        return json.dumps(labels)

    plain = Tool(
        name="raw",
        description="Tag, with the arguments as they came.",
        parameters={"type": "object", "properties": {"labels": {"type": "object"}}},
        fn=raw,
    )
    tools = tools_by_name([tag, plain])
    for name, arguments, content in [
        (
            "tag",
            {"labels": {"names": ["a"]}, "extra": {"names": ["b"]}},
            '[{"names": ["a", "tagged"]}, {"names": ["b", "tagged"]}]',
        ),
        ("raw", {"labels": {"names": ["a"]}}, '{"names": ["a", "tagged"]}'),
    ]:
        call = ToolCallPart(id="c1", name=name, arguments=arguments)
        said = call.arguments_json()
        out = await run_tool_call(call, tools, limit=None)
        assert out.tool_results[0].content == content
        assert call.arguments_json() == said  # the model's call, as it made it


def test_a_generator_function_is_refused_as_a_tool() -> None:
    def pieces(n: int) -> Iterator[str]:
        """Yield the pieces.

        Args:
            n: how many.
        """
        yield from ["a"] * n

    async def stream(n: int) -> AsyncIterator[str]:
        """Yield the pieces as they come.

        Args:
            n: how many.
        """
        for _ in range(n):
            yield "a"

    for fn in (pieces, stream, functools.partial(pieces, 2)):
        with pytest.raises(ToolError, match=r"yields \(a generator function\)"):
            Tool.from_function(fn)
    with pytest.raises(ToolError, match="'raw': its function yields"):
        Tool(name="raw", description="Raw.", parameters={"type": "object"}, fn=stream)


class Unreadable(Exception):
    """An exception whose message cannot be read: its ``__str__`` raises."""

    def __str__(self) -> str:
        raise AttributeError("no such field")


@pytest.mark.anyio
async def test_an_exception_with_no_readable_message_is_an_error_result() -> None:
    def fetch() -> str:
        """Fetch."""
        raise Unreadable

    out = await run_tool_call(
        ToolCallPart(id="c1", name="fetch"), tools_by_name([fetch]), limit=None
    )
    assert out.tool_results[0].is_error
    assert out.tool_results[0].content == (
        "tool 'fetch' failed: Unreadable: "
        "(its message could not be read: str() raised AttributeError)"
    )


def _renamed(path: str, limit: int = 10) -> str:
    """Read a file whose parameter was renamed after its docstring was written.

    Args:
        filename: the file to read.
        limit: the most lines.
    """
    return path


def test_a_docstring_describing_a_parameter_the_function_lacks_is_refused() -> None:
    with pytest.raises(ToolError) as caught:
        Tool.from_function(_renamed)
    assert str(caught.value) == (
        "tool '_renamed': its docstring describes a parameter 'filename', "
        "which it does not have (its parameters are path, limit): rename the "
        "entry to the parameter it describes, or remove it"
    )


class _Reader:
    """A reader.

    Attributes:
        root: where the files are.
    """

    root: str = "."

    def __call__(self, path: str) -> str:
        return path


def test_a_docstring_not_of_the_tools_own_parameters_is_not_checked() -> None:
    # A partial's docstring describes the parameters it fixed too, and a
    # callable instance without a __call__ docstring is described by its
    # class's, whose Attributes are not parameters.
    fixed = Tool.from_function(functools.partial(_renamed, "a.txt"))
    assert fixed.parameters["properties"]["limit"]["description"] == "the most lines."
    assert list(Tool.from_function(_Reader()).parameters["properties"]) == ["path"]


def _numpy_search(query: str, limit: int = 10, mode: str = "fast") -> list[str]:
    """Search the notes.

    Parameters
    ----------
    query : str
        what to look
        for.
    limit, mode
        how many, and how hard.

    Returns
    -------
    list of str
        the matches.
    """
    return [query]


def test_a_numpy_style_docstring_describes_the_parameters() -> None:
    # Its Parameters section was not read: the model got no description.
    tool = Tool.from_function(_numpy_search)
    assert tool.description == "Search the notes."
    props = tool.parameters["properties"]
    assert props["query"]["description"] == "what to look for."
    assert props["limit"]["description"] == "how many, and how hard."
    assert props["mode"]["description"] == "how many, and how hard."


def _rest_search(query: str, limit: int = 10) -> list[str]:
    """Search the notes.

    :param query: what to look
        for.
    :param int limit: the most results.
    :returns: the matches.
    """
    return [query]


def test_a_rest_style_docstring_describes_the_parameters() -> None:
    # Its :param fields were not read: the model got no description.
    tool = Tool.from_function(_rest_search)
    assert tool.description == "Search the notes."
    props = tool.parameters["properties"]
    assert props["query"]["description"] == "what to look for."
    assert props["limit"]["description"] == "the most results."


def _numpy_renamed(path: str) -> str:
    """Read a file.

    Parameters
    ----------
    filename : str
        the file.
    """
    return path


def test_a_numpy_style_docstring_describing_no_parameter_is_refused() -> None:
    with pytest.raises(ToolError, match="a parameter 'filename', which it does not"):
        Tool.from_function(_numpy_renamed)


def _exits(code: int) -> str:
    """Exit the way a command-line function does on bad input.

    Args:
        code: the exit status.
    """
    raise SystemExit(code)


async def _exits_async(code: int) -> str:
    """Exit from a coroutine.

    Args:
        code: the exit status.
    """
    raise SystemExit(code)


@pytest.mark.anyio
@pytest.mark.parametrize("fn", [_exits, _exits_async], ids=["sync", "async"])
async def test_a_tool_that_calls_sys_exit_fails_its_call_not_the_program(
    fn: Callable[..., Any],
) -> None:
    # SystemExit went through the run and ended the program, the call unanswered.
    tools = tools_by_name([fn])
    call = ToolCallPart(id="c", name=fn.__name__, arguments={"code": 3})
    out = await run_tool_call(call, tools, limit=None)
    (result,) = out.tool_results
    assert result.is_error
    assert result.content == f"tool {fn.__name__!r} failed: SystemExit: 3"


async def _awaits_a_cancelled_future(url: str) -> str:
    """Fetch a page through a pool that cancelled the request.

    Args:
        url: the page.
    """
    # What awaiting a future cancelled elsewhere raises, though nobody
    # cancelled the run.
    raise asyncio.CancelledError


@pytest.mark.anyio
async def test_a_tool_that_raises_cancelled_error_unasked_fails_its_call() -> None:
    # The run ended "interrupted" and CancelledError reached the caller,
    # whose task nobody had cancelled.
    def model(request: ModelRequest) -> Message:
        last = request.messages[-1]
        if last.tool_results:
            return reply(last.tool_results[0].content)
        return reply("", tool_call("fetch", "c1", url="https://example.com"))

    agent = Agent(
        model=FakeModelClient(model),
        tools=[function_tool(_awaits_a_cancelled_future, name="fetch")],
    )
    result = await agent.run("Fetch it.")
    assert result.outcome == "done"
    assert result.text == "tool 'fetch' failed: CancelledError"


@pytest.mark.anyio
async def test_a_tool_cancelled_with_its_run_still_ends_the_run() -> None:
    started = anyio.Event()

    async def wait(seconds: float) -> str:
        """Wait.

        Args:
            seconds: how long.
        """
        started.set()
        await anyio.sleep(seconds)
        return "waited"

    model = FakeModelClient(lambda _: reply("", tool_call("wait", "c1", seconds=60)))
    agent = Agent(model=model, tools=[wait])
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(agent.run, "Wait.")
            await started.wait()
            scope.cancel()
    assert scope.cancelled_caught
    assert agent.session.runs[-1].outcome == "interrupted"


def _logged(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A decorator whose plain wrapper returns what it wraps returns."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


@_logged
async def _fetch_page(url: str) -> str:
    """Fetch a page.

    Args:
        url: the page.
    """
    await anyio.lowlevel.checkpoint()
    return f"the page at {url}"


@pytest.mark.anyio
async def test_a_plain_wrapper_of_an_async_tool_has_its_coroutine_awaited() -> None:
    # The model got "<coroutine object _fetch_page at 0x...>", and Python
    # warned that the coroutine was never awaited: the tool never ran.
    tool = Tool.from_function(_fetch_page)
    assert await tool.invoke({"url": "a.html"}) == "the page at a.html"


class _Notes:
    def __init__(self) -> None:
        self.notes = {"todo": "Call the plumber."}

    def read(self, title: str) -> str:
        """Read a note.

        Args:
            title: the note's title.
        """
        return self.notes[title]


@pytest.mark.anyio
async def test_a_method_is_a_tool_bound_and_its_function_says_so() -> None:
    # The function in its class said only "parameter 'self' needs a type
    # annotation", as for any unannotated parameter.
    with pytest.raises(ToolError) as caught:
        Tool.from_function(_Notes.read)
    assert str(caught.value) == (
        "tool 'read': parameter 'self' needs a type annotation: a method is a "
        "tool as its bound method (give instance.method, after the instance is "
        "made), not as the function in its class"
    )
    tool = Tool.from_function(_Notes().read)
    assert list(tool.parameters["properties"]) == ["title"]
    assert await tool.invoke({"title": "todo"}) == "Call the plumber."


@dataclasses.dataclass
class _Lookup:
    """Look a word up.

    Attributes:
        word: the word.
        cache: filled as words are looked up.
    """

    word: str
    cache: dict[str, str] = dataclasses.field(default_factory=dict, init=False)


def test_a_class_made_a_tool_is_not_held_to_its_attributes() -> None:
    # A class's docstring describes its attributes, which need not all be
    # parameters of the tool.
    tool = Tool.from_function(_Lookup)
    assert tool.parameters["properties"] == {
        "word": {"type": "string", "description": "the word."}
    }


# A tool that ignores its cancellation cannot be stopped by anyone: its run,
# a cancel of it and a deadline around it all wait until it returns. What
# the run does then is what a timeout does (nothing it committed is lost),
# and a warning says which tool held it, and how long.
async def _held(seconds: float) -> str:
    """Wait, shielded from cancellation.

    Args:
        seconds: how long.
    """
    with anyio.CancelScope(shield=True):
        await anyio.sleep(seconds)
    return "late"


@pytest.mark.anyio
@pytest.mark.parametrize("stop", ["timeout", "cancel"])
async def test_a_tool_that_ignores_its_cancellation_holds_the_run_and_is_named(
    stop: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_tools, "_HELD_GRACE", 0.3)
    limit, held = (0.1, 0.6) if stop == "timeout" else (5.0, 0.6)
    agent = Agent(
        model=ScriptedModel.of(
            reply("", tool_call("_held", "c1", seconds=held)), reply("done")
        ),
        tools=[_held],
        tool_timeout=limit,
    )
    control = RunControl()
    caplog.set_level("WARNING", logger="turnfsm.tools")
    started = anyio.current_time()
    async with anyio.create_task_group() as group:
        if stop == "cancel":
            group.start_soon(_cancel_soon, control)
        with anyio.fail_after(10):
            result = await agent.run("go", control=control)
    waited = anyio.current_time() - started
    assert waited >= held  # nothing could stop it sooner
    session = await Session.load(agent.store, result.session_id)
    if stop == "cancel":  # ended as cancelled once the tool returned
        assert result.outcome == "cancelled"
        assert [r.outcome for r in session.runs] == ["cancelled"]
        return
    assert (result.outcome, result.text) == ("done", "done")
    (timed_out,) = [r for m in session.history for r in m.tool_results]
    assert timed_out.content == f"tool '_held' timed out after {limit}s"
    (warning,) = [r for r in caplog.records if r.name == "turnfsm.tools"]
    assert re.fullmatch(
        rf"tool '_held' \(call c1\) ignored its cancellation at its timeout of "
        rf"{limit}s: the run waited 0\.\ds more for it to return \(a shielded "
        r"wait, or a cancellation caught and not raised again, holds the run\)",
        warning.getMessage(),
    )


async def _cancel_soon(control: RunControl) -> None:
    await anyio.sleep(0.1)
    control.cancel()


@pytest.mark.anyio
async def test_a_model_call_that_ignores_its_timeout_is_named_once_it_returns(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = 0

    async def handle(_request: ModelRequest) -> ModelResponse:
        nonlocal calls
        calls += 1
        if calls == 1:
            with anyio.CancelScope(shield=True):
                await anyio.sleep(0.6)
        return ModelResponse(message=Message.assistant(f"reply {calls}"))

    monkeypatch.setattr(_tools, "_HELD_GRACE", 0.3)
    caplog.set_level("WARNING", logger="turnfsm.driver")
    driver = Driver(model=FakeModelClient(handle), model_timeout=0.1)
    with anyio.fail_after(5):
        result = await driver.run("hello")
    assert (result.outcome, result.text) == ("done", "reply 2")  # asked again
    (warning,) = [r for r in caplog.records if "ignored its cancellation" in r.message]
    assert warning.name == "turnfsm.driver"
    assert warning.getMessage().startswith(
        "model FakeModelClient ignored its cancellation at its timeout of 0.1s: "
        "the run waited 0."
    )


def _closes(reason: str) -> str:
    """Raise GeneratorExit, as a plain function may by mistake.

    Args:
        reason: its message.
    """
    raise GeneratorExit(reason)


@pytest.mark.anyio
async def test_a_plain_tool_that_raises_generator_exit_fails_its_call() -> None:
    # It went through the run's coroutines as the signal that they were being
    # closed: the run crashed, and asyncio complained on its way out.
    tools = tools_by_name([_closes])
    call = ToolCallPart(id="c", name="_closes", arguments={"reason": "done early"})
    out = await run_tool_call(call, tools, limit=None)
    (result,) = out.tool_results
    assert result.is_error
    assert result.content == "tool '_closes' failed: GeneratorExit: done early"


def _aborts(step: str) -> str:
    """Abort the way a library that turns its own abort into Ctrl-C does.

    Args:
        step: where it stopped.
    """
    raise KeyboardInterrupt(step)


@pytest.mark.anyio
async def test_a_plain_tool_that_raises_keyboard_interrupt_fails_its_call() -> None:
    # A worker thread gets no Ctrl-C: the tool raised it itself. It went
    # through the run as an interrupt, ending the program.
    model = ScriptedModel.of(reply("", tool_call("_aborts", "c1", step="x")), "ok")
    session = Session()
    result = await Driver(model=model, tools=[_aborts]).run("go", session=session)
    assert result.outcome == "done"
    (failed,) = session.history[2].tool_results
    assert (failed.content, failed.is_error) == (
        "tool '_aborts' failed: KeyboardInterrupt: x",
        True,
    )


@pytest.mark.anyio
async def test_a_run_goes_on_after_a_plain_tool_raised_generator_exit() -> None:
    from turnfsm import Agent
    from turnfsm.testing import ScriptedModel, reply, tool_call

    agent = Agent(
        model=ScriptedModel.of(
            reply("", tool_call("_closes", "c1", reason="x")), "answered"
        ),
        tools=[_closes],
    )

    result = await agent.run("go")

    assert result.ok, result.error
    assert result.text == "answered"


class RunContext:
    """What the OpenAI Agents SDK hands its tools first (RunContextWrapper)."""


def test_a_context_object_as_a_parameter_says_how_a_tool_gets_one() -> None:
    # The Agents SDK's habit: a first parameter `ctx: RunContextWrapper`.
    # It was only "unsupported annotation", with no word of the way.
    def lookup(ctx: RunContext, order: str) -> str:
        """Look an order up."""
        return order

    with pytest.raises(ToolError) as caught:
        Tool.from_function(lookup)
    assert str(caught.value).endswith(
        "parameter 'ctx': unsupported annotation "
        f"{RunContext!r}; the model fills in every parameter, as JSON: what "
        "your program gives the tool (a connection, the user) reaches it "
        "through a closure or a context variable"
    )
