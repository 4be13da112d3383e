"""Structured final answers end to end on the scripted model."""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Annotated, Any, Literal, TypedDict

import annotated_types
import attrs
import pydantic
import pytest

from tests.hand_written_machines import DONE_AFTER_TOOLS, edit
from tests.helpers import turn_toml_text
from turnfsm import Agent, approval_machine, machines_dir
from turnfsm._resources import compaction_machine
from turnfsm.context import ContextManager, TruncatingCompactor
from turnfsm.core import (
    Event,
    MachineSpec,
    ModelReplied,
    OutputRejected,
    Perform,
    ToolCallsReviewed,
    finishes_before_an_answer,
)
from turnfsm.driver import Driver, EffectContext, Session, replay
from turnfsm.errors import ConfigError, OutputInvalid, PinnedTooLarge
from turnfsm.messages import Message, Role
from turnfsm.persistence import EventRecorded, MemoryStore
from turnfsm.providers import ModelRequest
from turnfsm.serde import dumps, loads
from turnfsm.testing import FakeModelClient, ScriptedModel, reply, tool_call
from turnfsm.tokens import Meter, default_counter

pytestmark = pytest.mark.anyio


@dataclasses.dataclass
class Person:
    """A person.

    Attributes:
        name: The person's name.
        age: Their age in years.
    """

    name: str
    age: int


@attrs.frozen
class City:
    name: str
    population: int


class Pet(pydantic.BaseModel):
    name: str
    legs: int = pydantic.Field(ge=0)


class Movie(TypedDict):
    title: str
    year: int


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Tree(pydantic.BaseModel):
    """A pydantic model that contains itself (its schema is a `$ref`)."""

    value: int
    kids: list[Tree] = []


class Scores(pydantic.RootModel[list[int]]):
    """A pydantic model whose value is no object."""


def rejections(session: Session) -> list[OutputRejected]:
    return [
        e.event
        for e in session.entries
        if isinstance(e, EventRecorded) and isinstance(e.event, OutputRejected)
    ]


CASES: list[tuple[str, Any, str, Any]] = [
    ("dataclass", Person, '{"name": "Ada", "age": 36}', Person("Ada", 36)),
    ("attrs", City, '{"name": "Oslo", "population": 700000}', City("Oslo", 700000)),
    ("pydantic", Pet, '{"name": "Rex", "legs": 4}', Pet(name="Rex", legs=4)),
    (
        "typeddict",
        Movie,
        '{"title": "Up", "year": 2009}',
        {"title": "Up", "year": 2009},
    ),
    ("int", int, '{"result": 42}', 42),
    ("bare-int", int, "42", 42),
    ("list", list[str], '{"result": ["a", "b"]}', ["a", "b"]),
    ("literal", Literal["yes", "no"], '{"result": "yes"}', "yes"),
    ("enum", Colour, '{"result": "red"}', Colour.RED),
    ("float", float, '{"result": 2.5}', 2.5),
    ("bool", bool, '{"result": true}', True),
    ("dict", dict[str, int], '{"result": {"a": 1}}', {"a": 1}),
    ("fenced", Person, '```json\n{"name": "Ada", "age": 36}\n```', Person("Ada", 36)),
    (
        "recursive-pydantic",
        Tree,
        '{"value": 1, "kids": [{"value": 2, "kids": []}]}',
        Tree(value=1, kids=[Tree(value=2)]),
    ),
    ("root-model", Scores, '{"result": [1, 2]}', Scores([1, 2])),
    ("bare-root-model", Scores, "[1, 2]", Scores([1, 2])),
]


@pytest.mark.parametrize(
    ("tp", "text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
async def test_a_valid_answer_at_once_is_the_output(
    tp: Any, text: str, expected: Any
) -> None:
    model = ScriptedModel.of(text)

    result = await Driver(model=model, output_type=tp).run("go")

    assert result.ok, result.error
    assert result.output == expected
    assert type(result.output) is type(expected)
    assert result.text == text
    spec = model.requests[0].output
    assert spec is not None
    assert spec.schema["type"] == "object"


async def test_a_typed_result_on_run() -> None:
    model = ScriptedModel.of('{"name": "Ada", "age": 36}')
    result = await Driver(model=model).run("go", output_type=Person)

    person: Person | None = result.output
    assert person == Person("Ada", 36)


async def test_str_needs_no_structured_mode() -> None:
    model = ScriptedModel.of("plain words")

    result = await Driver(model=model, output_type=str).run("go")

    assert (result.output, model.requests[0].output) == ("plain words", None)


async def test_no_output_type_sends_no_output_spec() -> None:
    model = ScriptedModel.of("hi")

    result = await Driver(model=model).run("go")

    assert (result.output, model.requests[0].output) == (None, None)


async def test_invalid_then_valid_re_asks_with_the_errors() -> None:
    model = ScriptedModel.of(
        '{"name": "Ada", "age": "old", "extra": 1}', '{"name": "Ada", "age": 36}'
    )
    session = Session()

    result = await Driver(model=model, output_type=Person).run("go", session=session)

    assert result.ok
    assert result.output == Person("Ada", 36)
    assert result.turns == 2
    (rejected,) = rejections(session)
    assert rejected.errors == (
        'age: expected integer, got "old" (string)',
        "extra: unexpected (not a field of the answer)",
    )
    second = model.requests[1].messages
    assert [m.role for m in second] == [Role.USER, Role.ASSISTANT, Role.USER]
    assert second[1].text == '{"name": "Ada", "age": "old", "extra": 1}'
    assert "age: expected integer" in second[2].text
    assert "extra: unexpected" in second[2].text
    assert [m.text for m in session.history][-1] == '{"name": "Ada", "age": 36}'
    assert len(session.history) == 4
    fired = [
        (e.phase, e.decision)
        for e in session.entries
        if isinstance(e, EventRecorded) and isinstance(e.event, OutputRejected)
    ]
    assert fired == [("start", "measure")]


async def test_not_json_is_rejected_with_a_reason() -> None:
    model = ScriptedModel.of("I think Ada is 36", '{"result": 36}')
    session = Session()

    result = await Driver(model=model, output_type=int).run("go", session=session)

    assert result.output == 36
    (rejected,) = rejections(session)
    assert rejected.errors[0].startswith("(the answer): expected JSON")


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [101, 5000])
async def test_json_nested_too_deep_is_rejected_and_asked_again(depth: int) -> None:
    model = ScriptedModel.of(nested(depth), "[1]")
    session = Session()

    result = await Driver(model=model, output_type=list).run("go", session=session)

    assert (result.outcome, result.output) == ("done", [1])
    (rejected,) = rejections(session)
    assert rejected.errors == ("(the answer): expected JSON nested at most 100 deep",)


async def test_json_nested_too_deep_every_time_fails_typed() -> None:
    model = FakeModelClient(lambda request: nested(5000))
    driver = Driver(model=model, output_type=list, max_output_retries=0)

    result = await driver.run("go")

    assert result.outcome == "failed"
    assert isinstance(result.error, OutputInvalid)
    assert result.error.errors == (
        "(the answer): expected JSON nested at most 100 deep",
    )


async def test_json_nested_100_deep_is_an_answer() -> None:
    model = ScriptedModel.of(nested(100))

    result = await Driver(model=model, output_type=list).run("go")

    assert result.outcome == "done"
    assert json.dumps(result.output, separators=(",", ":")) == nested(100)


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        # Python reads NaN and Infinity (and 1e400 as infinity); JSON has
        # neither: such an answer was the run's output.
        ("NaN", "a finite number (JSON has no NaN or infinity)"),
        ('{"result": Infinity}', "a finite number (JSON has no NaN or infinity)"),
        ('{"result": 1e400}', "a finite number (JSON has no NaN or infinity)"),
        # Past 4,300 digits Python's own refusal told the model to call
        # sys.set_int_max_str_digits().
        ("9" * 5000, "an int of at most 4,000 digits"),
        ("4" * 4001, "an int of at most 4,000 digits"),
    ],
)
async def test_numbers_json_has_no_way_to_say_are_rejected_and_asked_again(
    answer: str, said: str
) -> None:
    model = ScriptedModel.of(answer, "2.5")
    session = Session()

    result = await Driver(model=model, output_type=float).run("go", session=session)

    assert (result.outcome, result.output) == ("done", 2.5)
    (rejected,) = rejections(session)
    assert rejected.errors == (f"(the answer): expected {said}",)
    assert "sys." not in rejected.feedback.text


async def test_an_int_of_4000_digits_is_an_answer() -> None:
    model = ScriptedModel.of("9" * 4000)

    result = await Driver(model=model, output_type=int).run("go")

    assert result.output == 10**4000 - 1


async def test_a_type_refusing_a_value_is_a_rejection() -> None:
    model = ScriptedModel.of(
        '{"name": "Rex", "legs": -1}', '{"name": "Rex", "legs": 3}'
    )
    session = Session()

    result = await Driver(model=model, output_type=Pet).run("go", session=session)

    assert result.output == Pet(name="Rex", legs=3)
    (rejected,) = rejections(session)
    assert "legs" in rejected.errors[0]


@pytest.mark.parametrize("retries", [0, 1, 2])
async def test_invalid_every_time_fails_bounded_by_max_output_retries(
    retries: int,
) -> None:
    model = FakeModelClient(lambda request: '{"result": "many"}')
    session = Session()
    driver = Driver(model=model, output_type=int, max_output_retries=retries)

    result = await driver.run("go", session=session)

    assert result.outcome == "failed"
    assert isinstance(result.error, OutputInvalid)
    assert result.error.errors == (
        '(the answer): expected integer, got "many" (string)',
    )
    assert result.error.retries == retries
    assert len(model.requests) == retries + 1
    # Every call counts, the last one too: the result, the log and the trace agree.
    assert result.turns == retries + 1 == len(session.runs[0].turns)
    assert result.output is None
    assert list(session.history) == []


async def test_a_tool_call_reply_is_not_validated() -> None:
    def lookup(name: str) -> str:
        """Look a person up."""
        return "36"

    model = ScriptedModel.of(
        reply("", tool_call("lookup", "c1", name="Ada")), '{"name": "Ada", "age": 36}'
    )

    result = await Driver(model=model, tools=[lookup], output_type=Person).run("go")

    assert result.output == Person("Ada", 36)
    assert model.requests[0].output is not None


async def test_the_log_replays_with_the_rejection_and_resume_rereads_the_output() -> (
    None
):
    model = ScriptedModel.of('{"age": 1}', '{"name": "Ada", "age": 36}')
    session = Session()
    driver = Driver(model=model, output_type=Person)

    result = await driver.run("go", session=session)

    assert replay(driver.machine, session, result.run_id).ok
    for entry in session.entries:
        assert loads(type(entry), dumps(entry)) == entry
    assert len(rejections(session)) == 1


async def test_a_resumed_run_re_derives_the_output_from_the_final_text() -> None:
    store = MemoryStore()
    agent = Agent(
        model=ScriptedModel.of(
            reply("", tool_call("lambda_tool", "c1")), '{"result": ["x"]}'
        ),
        tools=[lambda_tool],
        machine=approval_machine(),
        output_type=list[str],
        store=store,
    )
    paused = await agent.run("go")
    assert paused.outcome == "paused"

    done = await agent.resume(
        paused.session_id, paused.run_id, ToolCallsReviewed.approve_all()
    )

    assert (done.outcome, done.output) == ("done", ["x"])


def lambda_tool() -> str:
    """A tool."""
    return "ok"


async def test_a_run_given_its_type_is_resumed_with_it_or_refused() -> None:
    # Resumed without the type run(..., output_type=) gave it, the model was
    # no longer asked for it and a reply that did not fit ended the run done.
    store = MemoryStore()
    model = ScriptedModel.of(
        reply("", tool_call("lambda_tool", "c1")),
        '{"name": "Ada", "age": "old"}',
        '{"name": "Ada", "age": 36}',
    )

    def make() -> Agent:
        return Agent(
            model=model, tools=[lambda_tool], machine=approval_machine(), store=store
        )

    paused = await make().run("go", output_type=Person)
    approve = ToolCallsReviewed.approve_all()

    with pytest.raises(ConfigError) as caught:
        await make().resume(paused.session_id, paused.run_id, approve)
    assert caught.value.field == "output_type"
    assert "began with (Person): resume it with that output_type" in str(caught.value)
    assert len(model.requests) == 1  # refused before anything ran
    with pytest.raises(ConfigError, match="began with \\(Person\\)"):
        await make().resume(paused.session_id, paused.run_id, approve, output_type=City)
    # A type of the same name but another schema is another type: it was
    # taken, and the run went on asking for another answer than its own.
    Other = attrs.make_class("Person", {"count": attrs.field(type=int)})
    with pytest.raises(ConfigError, match="Person, with another schema"):
        await make().resume(
            paused.session_id, paused.run_id, approve, output_type=Other
        )

    done = await make().resume(
        paused.session_id, paused.run_id, approve, output_type=Person
    )

    assert (done.outcome, done.output) == ("done", Person("Ada", 36))
    assert all(r.output is not None for r in model.requests)
    session = await make().open_session(done.session_id)
    assert len(rejections(session)) == 1
    assert replay(approval_machine(), session, paused.run_id).ok


async def test_a_run_begun_as_plain_text_is_not_resumed_as_a_type() -> None:
    # A run asked for plain text (output_type=str over the agent's type) was
    # resumed by an agent with a type, and came back as that type.
    store = MemoryStore()
    model = ScriptedModel.of(reply("", tool_call("lambda_tool", "c1")), "Ada is 36.")

    def make() -> Agent:
        return Agent(
            model=model,
            tools=[lambda_tool],
            machine=approval_machine(),
            store=store,
            output_type=Person,
        )

    paused = await make().run("go", output_type=str)
    approve = ToolCallsReviewed.approve_all()

    with pytest.raises(ConfigError, match="expected plain text, as run"):
        await make().resume(paused.session_id, paused.run_id, approve)
    done = await make().resume(
        paused.session_id, paused.run_id, approve, output_type=str
    )
    assert (done.outcome, done.output) == ("done", "Ada is 36.")


async def test_the_approval_machine_re_asks_too() -> None:
    model = ScriptedModel.of('{"result": "perhaps"}', '{"result": "no"}')
    session = Session()
    driver = Driver(
        model=model, machine=approval_machine(), output_type=Literal["yes", "no"]
    )

    result = await driver.run("go", session=session)

    assert (result.output, result.turns) == ("no", 2)
    (rejected,) = rejections(session)
    assert rejected.errors == (
        '(the answer): expected one of "yes", "no", got "perhaps" (string)',
    )
    assert replay(driver.machine, session, result.run_id).ok


async def test_a_machine_without_the_re_ask_is_refused_by_name() -> None:
    text = turn_toml_text()
    start = text.index("# -- a structured final answer")
    end = text.index("# -- at any time")
    text = text[:start] + text[end:]
    spec = MachineSpec.from_toml(text.replace('name = "turn"', 'name = "old"'))
    model = ScriptedModel.of("x")

    with pytest.raises(ConfigError) as caught:
        Driver(model=model, machine=spec, output_type=Person)
    # It said "invalid output_type='old'": the machine's name as the type's.
    assert (caught.value.field, caught.value.value) == ("machine", "old")
    assert str(caught.value) == (
        "invalid machine='old': expected a machine with an 'output_rejected'"
        " transition out of 'call_llm' to take an output_type: machine 'old'"
        " cannot re-ask for a structured answer that does not fit (copy the two"
        " 'output_rejected' transitions of the shipped turn.toml, in"
        " turnfsm.machines_dir())"
    )
    driver = Driver(model=model, machine=spec)
    with pytest.raises(ConfigError, match="old"):
        await driver.run("go", output_type=int)
    assert (await driver.run("go", output_type=str)).output == "x"


@pytest.mark.parametrize("tp", [Person, str], ids=["structured", "text"])
async def test_an_output_type_with_a_machine_that_calls_no_model_is_refused(
    tp: Any,
) -> None:
    # It was taken, and never read: such a machine's runs give no answer.
    expected = (
        "no output type with machine 'compaction': no phase of it calls the"
        ' model (decision = "call_llm"), so its runs have no answer to read;'
        " leave output_type out"
    )
    model = ScriptedModel.of()

    with pytest.raises(ConfigError) as caught:
        Agent(model=model, machine=compaction_machine(), output_type=tp)
    assert (caught.value.field, caught.value.value) == ("output_type", tp)
    assert caught.value.expected == expected
    driver = Driver(model=model, machine=compaction_machine())
    with pytest.raises(ConfigError) as caught:
        await driver.run("go", output_type=tp)
    assert (caught.value.field, caught.value.expected) == ("output_type", expected)


@dataclasses.dataclass
class Dangling:
    y: Nope  # type: ignore[name-defined]  # noqa: F821  # deliberately unresolvable


@pytest.mark.parametrize("tp", [object, 5, Dangling], ids=["object", "5", "dangling"])
async def test_a_type_without_a_json_form_is_a_config_error(tp: Any) -> None:
    with pytest.raises(ConfigError, match="output_type"):
        Driver(model=ScriptedModel.of(), output_type=tp)


class BadSchema(pydantic.BaseModel):
    """A model whose own schema is no valid JSON schema."""

    model_config = pydantic.ConfigDict(json_schema_extra={"required": 5})
    x: int


async def test_a_type_whose_schema_is_invalid_names_output_type() -> None:
    with pytest.raises(ConfigError) as caught:
        Driver(model=ScriptedModel.of(), output_type=BadSchema)

    assert caught.value.field == "output_type.required"
    assert caught.value.value == 5
    assert "Tool(" not in str(caught.value)


@pytest.mark.parametrize(
    ("tp", "message"),
    [
        (
            Person("Ada", 36),
            "invalid output_type=Person(name='Ada', age=36): expected a type, not "
            "a value of one (output_type=Person, the class)",
        ),
        (
            City("Paris", 2),
            "expected a type, not a value of one (output_type=City, the class)",
        ),
        ("Person", "invalid output_type='Person': expected a type, not its name"),
    ],
    ids=["dataclass instance", "attrs instance", "name"],
)
async def test_a_value_or_a_name_given_for_the_type_says_to_pass_the_type(
    tp: Any, message: str
) -> None:
    # An instance said "(unhashable type: 'Person')".
    with pytest.raises(ConfigError) as caught:
        Driver(model=ScriptedModel.of(), output_type=tp)
    assert message in str(caught.value)


@dataclasses.dataclass
class Slot:
    hour: Annotated[int, annotated_types.Interval(ge=0, le=23)]


class Tag(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    label: str = pydantic.Field(max_length=12)
    weight: int = pydantic.Field(ge=0)


def test_a_schema_with_a_keyword_strict_mode_lacks_is_not_sent_strict() -> None:
    from turnfsm.driver._output import OutputType

    # maxLength (a string's length) is no keyword of OpenAI's strict mode: a
    # strict request with it was refused (HTTP 400), failing the run.
    spec = OutputType.of(Tag).spec
    assert spec is not None
    assert spec.schema["properties"]["label"]["maxLength"] == 12
    assert spec.strict is False
    bounded = OutputType.of(Slot).spec
    assert bounded is not None
    assert bounded.schema["properties"]["hour"]["minimum"] == 0
    assert bounded.strict is True  # numbers' bounds are strict mode's too


async def test_the_request_carries_the_schema_and_strictness() -> None:
    seen: list[ModelRequest] = []

    def answer(request: ModelRequest) -> str:
        seen.append(request)
        return json.dumps({"result": 1})

    await Driver(model=FakeModelClient(answer), output_type=int).run("go")
    await Driver(model=FakeModelClient(answer), output_type=Pet).run(
        "go"
    )  # pydantic: a default field is not required, so not strict

    int_spec, pet_spec = seen[0].output, seen[1].output
    assert int_spec is not None
    assert pet_spec is not None
    assert (int_spec.name, int_spec.strict) == ("int", True)
    assert int_spec.schema["properties"] == {"result": {"type": "integer"}}
    assert (pet_spec.name, pet_spec.strict) == ("Pet", False)


def report(fields: int) -> type:
    """A report with `fields` long-named fields: about 50 schema tokens each."""
    names = [f"finding_{i}_with_a_long_descriptive_name" for i in range(fields)]
    return attrs.make_class("Report", {name: attrs.field(type=str) for name in names})


def _sent_size(request: ModelRequest) -> int:
    """What the provider reads: messages, system, tools, the output schema, reply."""
    extras = [request.system or ""]
    if request.tools:
        extras.append(json.dumps([attrs.asdict(t) for t in request.tools]))
    if request.output is not None:
        extras.append(json.dumps(attrs.asdict(request.output)))
    meter = Meter(default_counter())
    return meter.measure(list(request.messages), extras=[e for e in extras if e]) + (
        request.max_tokens or 0
    )


async def test_the_output_schema_counts_against_the_window() -> None:
    # The schema rides every request (OpenAI's response_format, Anthropic's
    # forced tool): a request whose schema overflows the window is never sent.
    model = FakeModelClient(lambda request: '{"result": 1}')
    manager = ContextManager(context_window=2_000)
    driver = Driver(model=model, context=manager)

    with pytest.raises(PinnedTooLarge) as caught:
        await driver.run("Fill in the report.", output_type=report(150))

    assert caught.value.reserved > 2_000
    assert model.requests == []


def test_an_agent_whose_output_schema_cannot_fit_is_refused_when_made() -> None:
    # No run of it could send a request: it is refused before any is made.
    manager = ContextManager(context_window=2_000)
    with pytest.raises(ConfigError) as caught:
        Driver(
            model=FakeModelClient(lambda request: "{}"),
            context=manager,
            output_type=report(150),
        )

    assert caught.value.field == "output_type"
    assert "emergency line of the 2,000-token context window" in str(caught.value)


async def test_a_request_with_an_output_schema_stays_within_the_window() -> None:
    sizes: list[int] = []

    def answer(request: ModelRequest) -> Message | str:
        sizes.append(_sent_size(request))
        if len(sizes) < 10:
            return reply("", tool_call("note", text="a finding. " * 40))
        return json.dumps(dict.fromkeys(attrs.fields_dict(form), "none"))

    def note(text: str) -> str:
        """Keep a note.

        Args:
            text: The note.
        """
        return text

    window = 3_000
    form = report(20)  # a schema of a third of the window
    driver = Driver(
        model=FakeModelClient(answer),
        tools=[note],
        context=ContextManager(TruncatingCompactor(), context_window=window),
        output_type=form,
    )

    result = await driver.run("Write down what you find.")

    assert sizes
    assert all(size <= window for size in sizes), sizes
    assert result.ok or result.error is not None


async def test_an_answer_of_a_replaced_model_call_is_checked_as_the_built_in_s() -> (
    None
):
    # A model-call effect of the user's need not check the answer: the loop
    # does, so a run with an output type never ends done without its output.
    answers = iter(["no number", "42"])

    async def call_llm(ctx: EffectContext, decision: Perform) -> Event:
        return ModelReplied(reply(next(answers)))

    driver = Driver(
        model=FakeModelClient(lambda r: "unused"),
        output_type=int,
        effects={"call_llm": call_llm},
    )
    session = Session()

    result = await driver.run("go", session=session)

    assert (result.outcome, result.output) == ("done", 42)
    events = [e.event for e in session.entries if isinstance(e, EventRecorded)]
    (rejected,) = [e for e in events if isinstance(e, OutputRejected)]
    assert rejected.message.text == "no number"
    assert "(the answer): expected JSON" in rejected.errors[0], rejected.errors
    assert replay(None, session, result.run_id).ok


async def test_a_replaced_model_call_that_never_answers_in_the_type_fails_typed() -> (
    None
):
    async def call_llm(ctx: EffectContext, decision: Perform) -> Event:
        return ModelReplied(reply("no number"))

    driver = Driver(
        model=FakeModelClient(lambda r: "unused"),
        output_type=int,
        effects={"call_llm": call_llm},
    )

    result = await driver.run("go")

    assert (result.outcome, result.output) == ("failed", None)
    assert isinstance(result.error, OutputInvalid), result.error


async def test_a_machine_that_ends_done_after_its_tools_is_refused_by_name() -> None:
    # It ran: the run ended done with output None, the answer being the
    # empty text of the reply that called the tools.
    spec = MachineSpec.from_toml(DONE_AFTER_TOOLS, source="mine.toml")
    model = ScriptedModel.of(reply("", tool_call("look", q="x")), "x")
    expected = (
        "a machine whose runs end done only on the model's final reply to take"
        " an output_type: machine 'turn' ends the run in 'done' from"
        " 'run_tools' on 'tools_finished' after the tool results, which the"
        " model never answered, so the run would end done with no output; go"
        " to the model first (the shipped turn.toml's 'tools_finished' goes to"
        " 'start'), or leave output_type out"
    )

    for build in (Driver, Agent):
        with pytest.raises(ConfigError) as caught:
            build(model=model, machine=spec, output_type=Person)
        assert (caught.value.field, caught.value.value) == ("machine", "turn")
        assert caught.value.expected == expected
    driver = Driver(model=model, machine=spec, tools=[look])
    with pytest.raises(ConfigError) as caught:
        await driver.run("go", output_type=Person)
    assert caught.value.expected == expected
    # Plain text takes it: the answer is the text of the reply that called.
    result = await driver.run("go", output_type=str)
    assert (result.outcome, result.output, model.requests[-1].output) == (
        "done",
        "",
        None,
    )


async def look(q: str) -> str:
    """Look `q` up."""
    return "found"


@pytest.mark.parametrize(
    ("name", "old", "new", "way"),
    [
        (  # the turn limit ends the run done instead of failing it
            "turn",
            'dest = "failed"\nconditions = ["is_turn_limit_reached"]\n'
            'error = "max_turns_exceeded"\n',
            'dest = "done"\nconditions = ["is_turn_limit_reached"]\n',
            ("start", "measured", "the run's input"),
        ),
        (  # the review looks at the tools' work, and approves it
            "review",
            'trigger = "tools_finished"\nsource = "run_tools"\ndest = "start"',
            'trigger = "tools_finished"\nsource = "run_tools"\ndest = "await_review"',
            ("await_review", "approved", "the tool results"),
        ),
    ],
    ids=["turn-limit-ends-done", "review-after-tools"],
)
def test_each_way_into_done_before_an_answer_is_found(
    name: str, old: str, new: str, way: tuple[str, str, str]
) -> None:
    shipped = (machines_dir() / f"{name}.toml").read_text()
    spec = MachineSpec.from_toml(edit(shipped, old, new))

    found = finishes_before_an_answer(spec)

    assert [(src, t.trigger, what) for src, t, what in found] == [way]
    with pytest.raises(ConfigError, match="end done only on the model's final"):
        Driver(
            model=ScriptedModel.of(),
            machine=spec,
            output_type=int,
            effects={"review": _approve} if name == "review" else {},
        )
    assert finishes_before_an_answer(MachineSpec.from_toml(shipped)) == ()


async def _approve(ctx: EffectContext, decision: Perform) -> Event:
    raise AssertionError("never run")
