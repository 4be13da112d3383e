"""Tools whose parameters are an attrs class or a pydantic model, end to end."""

from __future__ import annotations

import dataclasses
import datetime
import gc
import subprocess
import sys
import textwrap
import weakref
from typing import Literal

import attrs
import pydantic
import pytest

from turnfsm.driver import Driver, Session, Tool, function_tool
from turnfsm.messages import Role
from turnfsm.testing import ScriptedModel, reply, tool_call

pytestmark = pytest.mark.anyio


@attrs.frozen
class Address:
    """Where to send it.

    Attributes:
        city: the city.
        zip: the postal code.
    """

    city: str
    zip: str


@attrs.frozen
class Shipment:
    """A shipment to book.

    Attributes:
        address: where it goes.
        weight_kg: how heavy it is.
        speed: how fast it must arrive.
        fragile: whether to handle it with care.
    """

    address: Address
    weight_kg: float
    speed: Literal["standard", "express"] = "standard"
    fragile: bool = False


booked: list[Shipment] = []


@function_tool
def book(shipment: Shipment) -> str:
    """Book a shipment."""
    booked.append(shipment)
    return f"booked to {shipment.address.city}"


class Refund(pydantic.BaseModel):
    """A refund to issue."""

    model_config = pydantic.ConfigDict(extra="forbid")

    order_id: str = pydantic.Field(description="the order to refund")
    amount: float = pydantic.Field(gt=0)
    reason: Literal["damaged", "late", "other"]
    notes: list[str] = []

    @pydantic.field_validator("order_id")
    @classmethod
    def _looks_like_an_order(cls, value: str) -> str:
        if not value.startswith("ord_"):
            raise ValueError("an order id starts with ord_")
        return value


refunds: list[Refund] = []


@function_tool
def refund(args: Refund) -> dict[str, object]:
    """Issue a refund."""
    refunds.append(args)
    return {"refunded": args.amount}


def history_results(session: Session) -> list[tuple[str, bool]]:
    return [
        (m.tool_results[0].content, m.tool_results[0].is_error)
        for m in session.history
        if m.role is Role.TOOL
    ]


def test_an_attrs_class_gives_the_schema_by_its_fields() -> None:
    assert book.parameters == {
        "type": "object",
        "properties": {
            "address": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "the city."},
                    "zip": {"type": "string", "description": "the postal code."},
                },
                "required": ["city", "zip"],
                "additionalProperties": False,
                "description": "where it goes.",
            },
            "weight_kg": {"type": "number", "description": "how heavy it is."},
            "speed": {
                "enum": ["standard", "express"],
                "description": "how fast it must arrive.",
            },
            "fragile": {
                "type": "boolean",
                "description": "whether to handle it with care.",
            },
        },
        "required": ["address", "weight_kg"],
        "additionalProperties": False,
    }


def test_a_pydantic_model_gives_its_own_schema() -> None:
    assert refund.parameters == Refund.model_json_schema()
    assert refund.description == "Issue a refund."


async def test_an_attrs_parameters_class_end_to_end() -> None:
    booked.clear()
    bad = tool_call(
        "book", "c1", address={"city": "Oslo"}, weight_kg="2", speed="overnight"
    )
    good = tool_call("book", "c2", address={"city": "Oslo", "zip": "0150"}, weight_kg=2)
    model = ScriptedModel.of(reply("", bad), reply("", good), "booked it")
    session = Session()
    result = await Driver(model=model, tools=[book]).run("ship it", session=session)
    assert (result.outcome, result.text) == ("done", "booked it")
    assert model.requests[0].tools[0].parameters == book.parameters
    (first, first_error), second = history_results(session)
    assert first_error
    assert first.splitlines()[1:-1] == [
        "- address.zip: missing (required)",
        '- weight_kg: expected number, got "2" (string)',
        '- speed: expected one of "standard", "express", got "overnight" (string)',
    ]
    assert second == ("booked to Oslo", False)
    assert booked == [Shipment(address=Address("Oslo", "0150"), weight_kg=2.0)]
    assert type(booked[0].weight_kg) is float


async def test_a_pydantic_parameters_model_end_to_end() -> None:
    refunds.clear()
    calls = [
        tool_call("refund", "c1", order_id="ord_1", amount="5", reason="meh", x=1),
        tool_call("refund", "c2", order_id="o1", amount=0.5, reason="late"),
        tool_call("refund", "c3", order_id="ord_1", amount=5, reason="late"),
    ]
    model = ScriptedModel.of(*(reply("", c) for c in calls), "refunded")
    session = Session()
    result = await Driver(model=model, tools=[refund]).run("refund", session=session)
    assert result.ok
    schema_error, validator_error, ok = history_results(session)
    assert schema_error[1]
    assert sorted(schema_error[0].splitlines()[1:-1]) == [
        '- amount: expected number, got "5" (string)',
        '- reason: expected one of "damaged", "late", "other", got "meh" (string)',
        "- x: unexpected (not a parameter of this tool)",
    ]
    # The model's own validator, past the schema, answers in the same form.
    assert validator_error == (
        "invalid arguments for tool 'refund'; it did not run:\n"
        '- order_id: Value error, an order id starts with ord_, got "o1" (string)\n'
        "Call 'refund' again with corrected arguments.",
        True,
    )
    assert ok == ('{"refunded": 5.0}', False)
    assert refunds == [Refund(order_id="ord_1", amount=5, reason="late")]


async def test_a_pydantic_model_as_one_of_several_parameters_is_a_nested_object() -> (
    None
):
    seen: list[tuple[Refund, bool]] = []

    def refund_later(refund: Refund, notify: bool = True) -> str:
        """Queue a refund."""
        seen.append((refund, notify))
        return "queued"

    tool = Tool.from_function(refund_later)
    assert tool.parameters["properties"]["refund"]["title"] == "Refund"
    model = ScriptedModel.of(
        reply(
            "",
            tool_call("refund_later", "c1", refund={"order_id": "ord_2"}),
            tool_call(
                "refund_later",
                "c2",
                refund={"order_id": "ord_2", "amount": 1, "reason": "other"},
                notify=False,
            ),
        ),
        "ok",
    )
    session = Session()
    await Driver(model=model, tools=[tool]).run("later", session=session)
    (missing, is_error), queued = history_results(session)
    assert is_error
    assert missing.splitlines()[1:-1] == [
        "- refund.amount: missing (required)",
        "- refund.reason: missing (required)",
    ]
    assert queued == ("queued", False)
    assert seen == [(Refund(order_id="ord_2", amount=1, reason="other"), False)]


class Folder(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    name: str
    children: list[Folder] = []


class Sizes(pydantic.RootModel[list[int]]):
    pass


async def test_a_recursive_pydantic_model_is_the_arguments_object() -> None:
    # Its schema is a reference ({"$ref": "#/$defs/Folder"}): the tool was
    # refused with "Tool('make_tree').parameters.type=None: expected object".
    made: list[Folder] = []

    def make_tree(tree: Folder) -> str:
        """Make a tree of folders."""
        made.append(tree)
        return "made"

    tool = Tool.from_function(make_tree)
    assert tool.parameters["type"] == "object"
    assert list(tool.parameters["properties"]) == ["name", "children"]
    inner = {"name": "b", "children": [{"name": 3}]}
    model = ScriptedModel.of(
        reply("", tool_call("make_tree", "c1", name="a", children=[inner])),
        reply("", tool_call("make_tree", "c2", name="a", children=[{"name": "b"}])),
        "ok",
    )
    session = Session()
    await Driver(model=model, tools=[tool]).run("make", session=session)
    (bad, is_error), made_ok = history_results(session)
    assert is_error
    assert bad.splitlines()[1:-1] == [
        "- children[0].children[0].name: expected string, got 3 (integer)"
    ]
    assert made_ok == ("made", False)
    assert made == [Folder(name="a", children=[Folder(name="b")])]


async def test_a_pydantic_root_model_alone_is_one_parameter() -> None:
    # Its schema is an array: the tool was refused with
    # "Tool('total').parameters.type='array': expected object".
    def total(sizes: Sizes) -> int:
        """Add sizes up."""
        return sum(sizes.root)

    tool = Tool.from_function(total)
    assert tool.parameters["required"] == ["sizes"]
    assert tool.parameters["properties"]["sizes"]["type"] == "array"
    assert await tool.invoke({"sizes": [1, 2]}) == "3"


class Span(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    lines: tuple[int, int]
    none: tuple[()] = ()


async def test_every_array_of_a_pydantic_schema_says_its_items() -> None:
    # pydantic describes a tuple by "prefixItems" alone: OpenAI refused the
    # tool ("array schema missing items"), and reads no "prefixItems".
    def show(span: Span) -> str:
        """Show some lines."""
        return f"{span.lines[0]}-{span.lines[1]}"

    tool = Tool.from_function(show)
    lines = tool.parameters["properties"]["lines"]
    assert lines["items"] == {"type": "integer"}
    assert lines["prefixItems"] == [{"type": "integer"}, {"type": "integer"}]
    assert tool.parameters["properties"]["none"]["items"] == {}
    assert await tool.invoke({"lines": [3, 9]}) == "3-9"


class Booking(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(strict=True, extra="forbid")

    day: datetime.date
    kind: Literal["table", "room"]
    seats: tuple[int, int]


async def test_a_strict_pydantic_model_reads_the_arguments_as_json() -> None:
    # Read as Python values, a strict model refused every call: a date is an
    # ISO string in JSON ("Input should be a valid date"), a tuple a list.
    def book(booking: Booking) -> str:
        """Book."""
        return f"{booking.day.isoformat()} {booking.kind} {booking.seats}"

    tool = Tool.from_function(book)
    arguments = {"day": "2025-05-02", "kind": "table", "seats": [2, 4]}
    assert await tool.invoke(arguments) == "2025-05-02 table (2, 4)"
    model = ScriptedModel.of(
        reply("", tool_call("book", "c1", day="May 2", kind="table", seats=[2, 4])),
        "ok",
    )
    session = Session()
    await Driver(model=model, tools=[tool]).run("book", session=session)
    ((content, is_error),) = history_results(session)
    assert is_error
    assert content.splitlines()[1].startswith("- day: Input should be a valid date")


def test_pydantic_is_imported_only_by_tools_that_use_it() -> None:
    code = textwrap.dedent(
        """
        import sys
        import attrs
        from turnfsm.driver import Driver, function_tool

        @attrs.frozen
        class P:
            x: int

        @function_tool
        def f(p: P) -> int:
            return p.x

        assert "pydantic" not in sys.modules, "pydantic was imported"
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_tools_built_per_request_from_types_made_per_request_do_not_pile_up() -> None:
    # A server whose tools take a type made for each request (a dataclass
    # of the user's fields): once the request is over, its type may go.
    made: list[weakref.ref[type]] = []
    for request in range(1200):
        query = dataclasses.make_dataclass(f"Query{request}", [("text", str)])

        def search(q: str) -> str:
            """Search.

            Args:
                q: the query.
            """
            return str(q)

        search.__annotations__["q"] = query
        Tool.from_function(search)
        made.append(weakref.ref(query))
        del query, search
    gc.collect()

    alive = sum(1 for ref in made if ref() is not None)
    assert alive <= 1024  # of the 1,200 made
