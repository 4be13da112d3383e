"""Structured final answers: the output type's schema, and the reply read back.

The one mechanism tool arguments use serves the final answer too: the
annotation's JSON schema comes from `turnfsm.driver._schema` (a pydantic
model describes itself), the reply's JSON is checked against it with
`jsonschema` and every problem listed (`turnfsm.driver._arguments`), and
the valid JSON is read into the type by the same cattrs converter (a
pydantic model by its `model_validate_json`).

A type that is not an object (a primitive, a list, a `Literal`, an enum) is
wrapped for the provider as an object of one property, ``{"result": ...}``,
and unwrapped here. `str` asks for no structured mode: the text is the answer.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from typing import Any, Final, final

import attrs

from turnfsm._checks import LONG_INT, TOO_DEEP, json_fault
from turnfsm.core import MachineSpec, finishes_before_an_answer
from turnfsm.driver._arguments import (
    ArgumentsCheck,
    InvalidArguments,
    Problem,
    arguments_check,
    check_arguments,
    problems_of_structuring,
)
from turnfsm.driver._child import as_json
from turnfsm.driver._schema import (
    Unsupported,
    class_schema,
    is_params_class,
    schema_of,
    structure_hook,
)
from turnfsm.errors import ConfigError
from turnfsm.providers import OutputSpec

__all__ = [
    "PLAIN_TEXT",
    "OutputType",
    "asked_for",
    "check_machine",
    "check_resumed",
    "is_strict",
    "output_digest",
]

WRAPPER: Final = "result"
"""The one property a non-object output is wrapped in."""

_FENCE: Final = re.compile(r"^\s*```[A-Za-z0-9_-]*\s*\n?(.*?)\n?\s*```\s*$", re.S)
_TRIGGER: Final = "output_rejected"


@final
@attrs.frozen(kw_only=True)
class OutputType:
    """A run's output type: what the provider is asked for and how replies are read.

    Build one with `OutputType.of`; `spec` is None for `str` (plain text).
    """

    tp: Any = attrs.field(eq=False)
    spec: OutputSpec | None
    wrapped: bool
    _validator: ArgumentsCheck | None = attrs.field(eq=False, repr=False)
    _read: Callable[[Any], Any] = attrs.field(eq=False, repr=False)
    digest: str = attrs.field(init=False, eq=False, repr=False)
    """A digest of the answer's schema (`PLAIN_TEXT` for plain text), made once."""

    @digest.default
    def _digest(self) -> str:
        if self.spec is None:
            return PLAIN_TEXT
        text = json.dumps(self.spec.schema, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @classmethod
    def of(cls, tp: Any) -> OutputType:
        """Describe `tp` (a dataclass, attrs class, pydantic model, TypedDict, ...).

        Raises:
            ConfigError: `tp` has no JSON schema (names the problem).
        """
        if tp is str:
            return cls(tp=tp, spec=None, wrapped=False, validator=None, read=str)
        if isinstance(tp, str):  # never resolved: a name is not its type
            raise ConfigError(
                "output_type", tp, f"a type, not its name (output_type={tp})"
            )
        if not isinstance(tp, type) and is_params_class(type(tp)):
            kind = type(tp).__name__
            raise ConfigError(
                "output_type",
                tp,
                f"a type, not a value of one (output_type={kind}, the class)",
            )
        defs: dict[str, Any] = {}
        wrapped = not is_params_class(tp)
        try:
            inner = dict(schema_of(tp, defs) if wrapped else class_schema(tp, defs))
            read = structure_hook(tp)
        except (Unsupported, NameError, TypeError) as exc:
            # NameError: an annotation that does not resolve (a forward ref).
            raise ConfigError(
                "output_type", tp, f"a type with a JSON form ({exc})"
            ) from None
        # A class whose value is no object (a pydantic `RootModel` of a
        # list) is wrapped like any other value.
        wrapped = wrapped or inner.get("type") != "object"
        schema: dict[str, Any] = (
            {
                "type": "object",
                "properties": {WRAPPER: inner},
                "required": [WRAPPER],
                "additionalProperties": False,
            }
            if wrapped
            else inner
        )
        if defs:
            schema["$defs"] = {**schema.get("$defs", {}), **defs}
        name = _name_of(tp)
        validator = arguments_check(name, schema, field="output_type")
        spec = OutputSpec(name=name, schema=schema, strict=is_strict(schema))
        return cls(tp=tp, spec=spec, wrapped=wrapped, validator=validator, read=read)

    def parse(self, text: str) -> Any:
        """Read the reply's text as a value of the output type.

        Raises:
            InvalidArguments: the text is not JSON (or JSON nested more
                than 100 deep), or does not fit the schema, or the type
                refused it; each problem is listed.
        """
        if self._validator is None:
            return text
        try:
            data = json.loads(_unfenced(text), parse_int=_read_int)
        except _LongInt:
            raise InvalidArguments([Problem((), f"expected {LONG_INT}")]) from None
        except ValueError as exc:
            raise InvalidArguments([Problem((), f"expected JSON ({exc})")]) from None
        except RecursionError:  # deeper than the decoder goes
            raise InvalidArguments([Problem((), f"expected {TOO_DEEP}")]) from None
        # NaN and Infinity, which Python reads, are no JSON: asked again.
        fault = json_fault(data, finite=True)
        if fault is not None:
            raise InvalidArguments([Problem((), f"expected {fault[2]}")])
        if self.wrapped and not (isinstance(data, Mapping) and WRAPPER in data):
            data = {WRAPPER: data}  # the bare value, as small models often send
        check_arguments(self._validator, data)
        value = data[WRAPPER] if self.wrapped else data
        try:
            return self._read(value)
        except Exception as exc:
            problems = problems_of_structuring(exc)
            if self.wrapped:
                problems = [attrs.evolve(p, path=(WRAPPER, *p.path)) for p in problems]
            raise InvalidArguments(problems) from exc

    def answer_json(self, text: str) -> str:
        """Return the answer in `text` as the JSON of its value, for a caller.

        The value `parse` reads (defaults filled in, the type's own
        validation applied), as JSON, as a tool's value is written: a
        sub-agent's caller gets that, not the reply as written (fenced, or
        wrapped in the object the provider was asked for). Plain text, or
        text that is no answer of the type, is returned as it is.
        """
        if self._validator is None:
            return text
        try:
            return as_json(self.parse(text))
        except (InvalidArguments, TypeError, ValueError, RecursionError):
            return text

    def errors(self, exc: InvalidArguments) -> tuple[str, ...]:
        """Return each problem as one line for the model, paths in the answer."""
        return tuple(self._describe(p) for p in exc.problems)

    def _describe(self, problem: Problem) -> str:
        path = problem.path
        if self.wrapped and path[:1] == (WRAPPER,):
            path = path[1:]
        text = str(attrs.evolve(problem, path=path))
        text = text.replace("not a parameter of this tool", "not a field of the answer")
        return text.replace("(the arguments)", "(the answer)", 1)


class _LongInt(ValueError):
    """An int in an answer longer than a record holds."""


def _read_int(digits: str) -> int:
    """An answer's int; one past 4,000 digits is refused before it is read.

    Python refuses to read one past 4,300 with advice for the programmer
    (``sys.set_int_max_str_digits``), which the model would be sent.
    """
    if len(digits) > 4001:  # a sign and 4,000 digits
        raise _LongInt
    return int(digits)


def asked_for(output: OutputType | None) -> str | None:
    """The name of the structured answer `output` asks for; None: plain text."""
    return None if output is None or output.spec is None else output.spec.name


PLAIN_TEXT: Final = "text"
"""The `output_digest` of a run asked for plain text."""


def output_digest(output: OutputType | None) -> str:
    """A digest of the schema of the answer `output` asks for (`PLAIN_TEXT`: none)."""
    return PLAIN_TEXT if output is None else output.digest


def check_resumed(
    run_id: str, began: str | None, digest: str | None, output: OutputType | None
) -> None:
    """Refuse to resume a run with another output type than it began with.

    `began` is the name of the answer the run began asking for (its log's;
    None: plain text), `digest` its schema's (`output_digest`); resumed
    with another, the model would be asked for another answer than the
    run's (or none, and any reply would do). A log written before the
    digest was kept is checked by the name only, and its runs that began
    with plain text take any type.

    Raises:
        ConfigError: `output` is not the type the run began with (names
            `output_type` and both types).
    """
    given = asked_for(output)
    if digest is not None:
        if output_digest(output) == digest:
            return
    elif began is None or given == began:
        return
    if began is None:
        raise ConfigError(
            "output_type",
            None if output is None else output.tp,
            f"plain text, as run {run_id!r} began with: resume it with "
            "output_type=str (or on an agent with no output_type)",
        )
    raise ConfigError(
        "output_type",
        None if output is None else output.tp,
        f"the output type run {run_id!r} began with ({began}"
        + (", with another schema than this one" if given == began else "")
        + "): resume it with that output_type, as it was run (or on an agent"
        " whose output_type it is)",
    )


def _name_of(tp: Any) -> str:
    raw = getattr(tp, "__name__", None) or "output"
    name = re.sub(r"[^A-Za-z0-9_-]", "_", str(raw))[:64]
    return name or "output"


def _unfenced(text: str) -> str:
    match = _FENCE.match(text)
    return match.group(1) if match else text


_NOT_STRICT: Final = frozenset(
    {
        "minLength",
        "maxLength",
        "minProperties",
        "maxProperties",
        "patternProperties",
        "propertyNames",
        "unevaluatedProperties",
        "uniqueItems",
        "contains",
        "prefixItems",
    }
)
"""Keywords OpenAI's strict structured outputs refuse (a request with one is a 400)."""


def is_strict(schema: object) -> bool:
    """Tell whether `schema` qualifies for OpenAI's strict structured outputs.

    Every object schema must be closed (``additionalProperties: false``) and
    list all its properties as required, and use no keyword strict mode
    lacks (a string's length, ``maxLength``; an object's size): such a
    schema is sent without ``strict``, and the answer checked here.
    """
    if isinstance(schema, list):
        return all(is_strict(item) for item in schema)
    if not isinstance(schema, Mapping):
        return True
    if not _NOT_STRICT.isdisjoint(schema):
        return False
    if schema.get("type") == "object" or "properties" in schema:
        properties = schema.get("properties", {})
        if schema.get("additionalProperties") is not False:
            return False
        if set(schema.get("required", ())) != set(properties):
            return False
    return all(
        is_strict(value)
        for key, value in schema.items()
        if key not in ("enum", "const")
    )


def check_machine(spec: MachineSpec, output: OutputType) -> None:
    """Refuse a machine that cannot give, or re-ask for, the answer `output` asks.

    A machine with no model-call phase gives no answer at all: its runs'
    output would never be read. For a structured answer, every phase that
    calls the model must have an `output_rejected` transition, or a
    rejected answer would be an `IllegalEvent` at run time; and every way
    into a finish phase must come after the model's final reply (one
    without tool calls, checked against the type), or a run would end done
    with no output (`finishes_before_an_answer`).

    Raises:
        ConfigError: the machine calls no model (the field is
            `output_type`; names the machine), or a model-call phase has no
            `output_rejected` transition, or the machine may end done
            without the model's answer (the field is the machine; names it
            and the phases, or the transition).
    """
    calls = [s.name for s in spec.states if s.decision == "call_llm"]
    if not calls:
        raise ConfigError(
            "output_type",
            output.tp,
            f"no output type with machine {spec.name!r}: no phase of it calls"
            ' the model (decision = "call_llm"), so its runs have no answer'
            " to read; leave output_type out",
        )
    if output.spec is None:  # plain text is never rejected
        return
    handled = {
        src for t in spec.transitions if t.trigger == _TRIGGER for src in t.sources
    }
    missing = [p for p in calls if p not in handled]
    if missing:
        raise ConfigError(
            "machine",
            spec.name,
            f"a machine with an {_TRIGGER!r} transition out of "
            + ", ".join(map(repr, missing))
            + f" to take an output_type: machine {spec.name!r} cannot re-ask for"
            " a structured answer that does not fit (copy the two "
            f"{_TRIGGER!r} transitions of the shipped turn.toml, in"
            " turnfsm.machines_dir())",
        )
    unanswered = finishes_before_an_answer(spec)
    if unanswered:
        source, t, what = unanswered[0]
        raise ConfigError(
            "machine",
            spec.name,
            "a machine whose runs end done only on the model's final reply to"
            f" take an output_type: machine {spec.name!r} ends the run in"
            f" {t.dest or source!r} from {source!r} on {t.trigger!r} after"
            f" {what}, which the model never answered, so the run would end"
            " done with no output; go to the model first (the shipped turn.toml's"
            " 'tools_finished' goes to 'start'), or leave output_type out",
        )
