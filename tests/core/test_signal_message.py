"""A transition's ``message = KEY``: checked at load, applied by the brain, drawn."""

from __future__ import annotations

import pytest

from tests.helpers import REPO_ROOT, reply, user
from turnfsm.core import (
    Budget,
    MachineSpec,
    Measured,
    ModelReplied,
    RunStarted,
    Signal,
    TurnMachine,
    render_mermaid,
)
from turnfsm.errors import DefinitionError, InvalidMessage, MachineBroken
from turnfsm.messages import Message, Role
from turnfsm.persistence import machine_digest

REVIEW = (REPO_ROOT / "machines" / "review.toml").read_text(encoding="utf-8")
"""The shipped review machine: ``revise`` adds data ``feedback``."""

REVISE = """[[transitions]]
trigger = "revise"
source = "await_review"
dest = "start"
message = "feedback"
"""


def edit(text: str, old: str, new: str) -> str:
    """Replace the one occurrence of `old` in `text`."""
    assert text.count(old) == 1, old
    return text.replace(old, new)


def line_of(text: str, needle: str) -> int:
    """The 1-based line of the one line of `text` that holds `needle`."""
    lines = [n for n, line in enumerate(text.splitlines(), 1) if needle in line]
    assert len(lines) == 1, needle
    return lines[0]


TOOLS_FINISHED = '[[transitions]]\ntrigger = "tools_finished"\n'
GIVE_UP = """[[transitions]]
trigger = "give_up"
source = "await_review"
dest = "failed"
error = "cancelled"
message = "why"

"""

# (id, the edited file, the text on the line at fault, its field, the message)
BAD: list[tuple[str, str, str, str, str]] = [
    (
        "on-a-built-in-trigger",
        edit(REVIEW, TOOLS_FINISHED, TOOLS_FINISHED + 'message = "feedback"\n'),
        "",  # the added line: see _at_fault
        "message",
        "message is only for transitions on a signal (declared in signals)",
    ),
    (
        "not-a-string",
        edit(REVIEW, 'message = "feedback"', "message = 3"),
        "message = 3",
        "message",
        "message must be the non-empty name of a key of the signal's data, got 3",
    ),
    (
        "empty",
        edit(REVIEW, 'message = "feedback"', 'message = ""'),
        'message = ""',
        "message",
        "message must be the non-empty name of a key of the signal's data, got ''",
    ),
    (
        "a-list",
        edit(REVIEW, 'message = "feedback"', 'message = ["feedback"]'),
        'message = ["feedback"]',
        "message",
        "message must be the non-empty name of a key of the signal's data",
    ),
    (
        "into-a-fail-phase",
        edit(
            edit(REVIEW, '"approved", "revise"]', '"approved", "revise", "give_up"]'),
            REVISE,
            REVISE + "\n" + GIVE_UP,
        ),
        'message = "why"',
        "message",
        "message on a transition into the fail phase 'failed' would never reach "
        "the conversation",
    ),
    (
        "misspelt-key",
        edit(REVIEW, 'message = "feedback"', 'mesage = "feedback"'),
        'mesage = "feedback"',
        "mesage",
        "unknown key 'mesage'",
    ),
]


def _at_fault(case_id: str, text: str, needle: str) -> int:
    if case_id == "on-a-built-in-trigger":
        # The added line sits right below the tools_finished trigger.
        return line_of(text, 'trigger = "tools_finished"') + 1
    return line_of(text, needle)


@pytest.mark.parametrize(
    ("case_id", "text", "needle", "key", "message"), BAD, ids=[c[0] for c in BAD]
)
def test_a_bad_message_declaration_is_refused_on_its_line(
    case_id: str, text: str, needle: str, key: str, message: str
) -> None:
    with pytest.raises(DefinitionError) as refused:
        MachineSpec.from_toml(text, source="review.toml")

    problems = refused.value.problems
    line = _at_fault(case_id, text, needle)
    assert [(p.line, p.field.rsplit(".", 1)[-1]) for p in problems] == [(line, key)]
    assert message in problems[0].message
    assert f"review.toml:{line}: " in str(refused.value)


def test_a_misspelt_message_key_suggests_the_right_one() -> None:
    text = edit(REVIEW, 'message = "feedback"', 'mesage = "feedback"')

    with pytest.raises(DefinitionError) as refused:
        MachineSpec.from_toml(text)

    assert refused.value.problems[0].suggestion == "message"


def test_the_message_key_survives_the_stored_form() -> None:
    spec = MachineSpec.from_toml(REVIEW)
    data = spec.to_dict()

    (revise,) = [t for t in data["transitions"] if "message" in t]
    assert (revise["trigger"], revise["message"]) == ("revise", "feedback")
    again = MachineSpec.from_dict(data)
    assert again.transitions == spec.transitions
    assert machine_digest(again) == machine_digest(spec)


def test_the_message_key_is_part_of_the_digest_only_when_given() -> None:
    with_it = MachineSpec.from_toml(REVIEW)
    without = MachineSpec.from_toml(edit(REVIEW, 'message = "feedback"\n', ""))

    assert machine_digest(with_it) != machine_digest(without)
    assert all("message" not in t for t in without.to_dict()["transitions"])


def test_the_diagram_draws_what_the_signal_adds() -> None:
    text = render_mermaid(MachineSpec.from_toml(REVIEW))

    # The edge into `start` carries `approved [has_injected_messages]` too.
    assert '<br/>revise / adds feedback"| start' in text


def _in_review() -> TurnMachine:
    machine = TurnMachine.start(MachineSpec.from_toml(REVIEW), budget=Budget())
    machine.handle(RunStarted([user("How many?", id="m-ask")]))
    machine.handle(Measured(10))
    machine.handle(ModelReplied(reply("It is 42.", id="m-answer")))
    assert machine.phase == "await_review"
    return machine


def test_the_brain_adds_the_signals_message_to_pending() -> None:
    machine = _in_review()
    feedback = Message.user("Cite the source.", id="m-feedback")
    signal = Signal("revise", {"feedback": "Cite the source."}, feedback)

    assert machine.message_key(signal) == "feedback"
    machine.handle(signal)

    assert machine.phase == "start"
    assert [m.id for m in machine.snapshot.pending] == [
        "m-ask",
        "m-answer",
        "m-feedback",
    ]


def test_only_the_transition_that_fires_names_the_key() -> None:
    machine = _in_review()

    assert machine.message_key(Signal("approved")) is None
    machine.handle(Signal("approved"))
    assert machine.message_key(Signal("revise", {"feedback": "x"})) is None  # done


def test_a_phase_that_does_not_take_the_signal_names_no_key() -> None:
    machine = TurnMachine.start(MachineSpec.from_toml(REVIEW), budget=Budget())

    assert machine.message_key(Signal("revise", {"feedback": "x"})) is None


@pytest.mark.parametrize(
    ("signal", "reason"),
    [
        (Signal("revise", {}), "give the signal data {'feedback': TEXT}"),
        (Signal("revise", {"feedback": " "}), "and it is blank"),
        (
            Signal("revise", {"feedback": "Cite it."}),
            "the signal carries no message: feed it through the driver",
        ),
        (
            Signal("revise", {"feedback": "x"}, Message.assistant("x", id="m-x")),
            "a signal's message must be a user message",
        ),
    ],
    ids=["missing", "blank", "not-built", "not-a-user-message"],
)
def test_a_signal_without_its_message_is_refused_and_changes_nothing(
    signal: Signal, reason: str
) -> None:
    machine = _in_review()
    before = machine.snapshot

    with pytest.raises(InvalidMessage, match="revise") as refused:
        machine.handle(signal)

    assert reason in str(refused.value)
    assert machine.snapshot == before
    with pytest.raises(MachineBroken):
        machine.handle(Signal("approved"))
    assert machine.message_key(Signal("revise", {"feedback": "x"})) is None


def test_a_signal_message_is_a_user_message_in_the_request() -> None:
    machine = _in_review()
    feedback = Message.user("Cite the source.", id="m-feedback")
    machine.handle(Signal("revise", {"feedback": feedback.text}, feedback))

    decision = machine.handle(Measured(12))

    assert [m.role for m in decision.pending] == [  # type: ignore[union-attr]
        Role.USER,
        Role.ASSISTANT,
        Role.USER,
    ]
