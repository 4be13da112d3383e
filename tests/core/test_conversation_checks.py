"""The loader refuses a machine that would lose what was said, or stop a run on an
outcome of its own step: each rule, on the stock file changed once."""

from __future__ import annotations

import attrs
import pytest

from tests.helpers import turn_toml_text
from turnfsm import Driver, machines_dir
from turnfsm._resources import load_machine
from turnfsm.core import MachineSpec, _loader
from turnfsm.errors import DefinitionError
from turnfsm.testing import ScriptedModel

STOCK = turn_toml_text()
MODEL_FAILED = (
    '[[transitions]]\ntrigger = "model_failed"\nsource = "call_llm"\n'
    'dest = "failed"\nerror = "provider_error"\n'
)


def problems_of(text: str) -> list[tuple[int | None, str]]:
    with pytest.raises(DefinitionError) as error:
        MachineSpec.from_toml(text)
    return [(p.line, p.message) for p in error.value.problems]


def edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def line_of(text: str, needle: str, after: int = 0) -> int:
    """The line (from 1) of the first `needle` at or after line `after`."""
    lines = text.splitlines()
    return next(i + 1 for i in range(after, len(lines)) if needle in lines[i])


@pytest.mark.parametrize("path", sorted(machines_dir().glob("*.toml")))
def test_the_shipped_machines_keep_every_rule(path: object) -> None:
    assert load_machine(path).name  # type: ignore[arg-type]


def test_a_step_whose_outcome_has_no_transition_is_named_with_what_it_lacks() -> None:
    text = edit(STOCK, MODEL_FAILED, "")

    assert problems_of(text) == [
        (
            line_of(text, "call_llm          ="),
            "phase 'call_llm' emits call_llm but has no transition on 'model_failed':"
            " each outcome of its step needs one, or a run stops on it",
        )
    ]


def test_a_machine_no_run_can_start_is_refused() -> None:
    text = edit(
        STOCK,
        '[[transitions]]\ntrigger = "run_started"\nsource = "start"\n'
        'actions = ["record_start"]\n',
        "",
    )

    assert problems_of(text) == [
        (
            line_of(text, "start             ="),
            "the initial phase 'start' has no 'run_started' transition: no run could"
            " start",
        )
    ]


def test_a_pause_that_takes_no_answer_is_refused() -> None:
    text = edit(STOCK, 'run_tools         = { decision = "run_tools" }', "")
    text = text.replace('"run_tools"', '"await"').replace(
        "[states]\n", '[states]\nawait = { decision = "pause" }\n'
    )

    assert (
        line_of(text, "await = "),
        "phase 'await' pauses but takes no answer: give it a 'tool_calls_reviewed'"
        " or a signal transition",
    ) in problems_of(text)


@pytest.mark.parametrize(
    ("trigger", "reducer", "what"),
    [
        ("run_started", "record_start", "the run's input"),
        ("model_replied", "record_reply", "the model's reply"),
        ("tools_finished", "record_results", "the tool results"),
        ("message_injected", "record_injection", "the injected message"),
    ],
)
def test_a_transition_that_drops_what_its_event_brings_is_refused(
    trigger: str, reducer: str, what: str
) -> None:
    header = f'[[transitions]]\ntrigger = "{trigger}"\n'
    at = STOCK.index(header)
    # The first transition on the trigger loses its record.
    cut = STOCK.index(f'"{reducer}"', at)
    text = STOCK[:cut] + '"count_compaction"' + STOCK[cut + len(reducer) + 2 :]
    if trigger != "model_replied":
        text = text.replace('"count_compaction", "flush_inbox"', '"flush_inbox"')
        text = text.replace('actions = ["count_compaction"]', "actions = []", 1)

    found = problems_of(text)

    assert (
        line_of(text, header.splitlines()[0], STOCK[:at].count("\n")),
        f"a '{trigger}' transition that does not fail the run must keep {what}:"
        f" add '{reducer}' to its actions",
    ) in found


def test_a_transition_into_a_fail_phase_need_not_keep_anything() -> None:
    text = edit(
        STOCK,
        '[[transitions]]\ntrigger = "model_replied"\nsource = "call_llm"\n'
        'dest = "run_tools"\n',
        '[[transitions]]\ntrigger = "model_replied"\nsource = "call_llm"\n'
        'dest = "failed"\nconditions = ["is_turn_limit_reached"]\n'
        'error = "max_turns_exceeded"\n\n'
        '[[transitions]]\ntrigger = "model_replied"\nsource = "call_llm"\n'
        'dest = "run_tools"\n',
    )

    assert MachineSpec.from_toml(text).name == "turn"


def test_a_finish_phase_that_commits_nothing_is_refused() -> None:
    text = edit(
        STOCK,
        'done              = { decision = "finish", on_enter = ["commit_pending"] }',
        'done              = { decision = "finish" }',
    )

    assert problems_of(text) == [
        (
            line_of(text, "done              ="),
            "finish phase 'done' does not commit the run's messages: add"
            " 'commit_pending' to its on_enter (a run that ends done keeps what was"
            " said)",
        )
    ]


def test_a_commit_on_every_way_into_the_finish_phase_will_do() -> None:
    text = edit(
        STOCK,
        'done              = { decision = "finish", on_enter = ["commit_pending"] }',
        'done              = { decision = "finish" }',
    )
    text = edit(
        text,
        'dest = "done"\nactions = ["record_reply"]',
        'dest = "done"\nactions = ["record_reply", "commit_pending"]',
    )

    assert MachineSpec.from_toml(text).name == "turn"


@pytest.mark.parametrize(
    ("where", "reducer", "kind", "does"),
    [
        ("failed", "commit_pending", "finish", "commits the run's messages"),
        ("call_llm", "commit_pending", "finish", "commits the run's messages"),
        ("done", "discard_pending", "fail", "drops the run's messages"),
        (
            "run_tools",
            "flush_inbox",
            "measure",
            "adds the injected messages to the request",
        ),
    ],
)
def test_pending_is_committed_dropped_or_added_to_only_on_the_way_into_its_phase(
    where: str, reducer: str, kind: str, does: str
) -> None:
    line = next(s for s in STOCK.splitlines() if s.startswith(f"{where} "))
    body = line.split("=", 1)[1].strip()
    if "on_enter" in body:
        new = body.replace('on_enter = ["', f'on_enter = ["{reducer}", "')
    else:
        new = body[:-2] + f', on_enter = ["{reducer}"] }}'
    text = edit(STOCK, line, line.replace(body, new))

    assert (
        line_of(text, f"{where} "),
        f"'{reducer}' {does}: it may run only on the way into a {kind} phase (its"
        " on_enter, or a transition into it)",
    ) in problems_of(text)


def test_an_injection_cannot_end_the_run_done() -> None:
    text = edit(
        STOCK,
        '[[transitions]]\ntrigger = "message_injected"\nsource = "*"\n'
        'actions = ["record_injection"]',
        '[[transitions]]\ntrigger = "message_injected"\nsource = "*"\n'
        'dest = "done"\nactions = ["record_injection"]',
    )

    header = '[[transitions]]\ntrigger = "message_injected"\nsource = "*"'
    assert (
        text[: text.index(header)].count("\n") + 1,
        "a 'message_injected' transition cannot end the run done: it comes while a"
        " step runs, whose outcome would be lost",
    ) in problems_of(text)


HEARD = (
    '[[transitions]]\ntrigger = "model_replied"\nsource = "call_llm"\n'
    'dest = "start"\nconditions = ["has_injected_messages"]\n'
    'actions = ["record_reply"]\n\n'
)
ENDS = '[[transitions]]\ntrigger = "model_replied"\nsource = "call_llm"\ndest = "done"'


def test_ending_done_with_an_injected_message_unheard_is_refused() -> None:
    # The run ended done with the message in its inbox: never sent, never kept.
    text = edit(STOCK, HEARD, "")

    assert problems_of(text) == [
        (
            line_of(text, ENDS.partition("\n")[0], line_of(text, "has_tool_calls")),
            "phase 'call_llm' on 'model_replied' ends the run in 'done' though a"
            " message injected there may wait, never heard: put before it a"
            " transition on 'model_replied' with conditions = "
            "['has_injected_messages'] into another phase (the stock file's goes"
            " to 'start', where the model hears it)",
        )
    ]


def test_ending_done_from_a_phase_that_takes_no_injection_is_refused() -> None:
    """A message injected there waits outside the run, and the run ended done.

    It loaded: a message injected while the model answered its last call
    waited for a phase that takes it, none came, and the run ended done
    without it (left in the `RunControl`), never sent nor kept.
    """
    wildcard = (
        '[[transitions]]\ntrigger = "message_injected"\nsource = "*"\n'
        'actions = ["record_injection"]\n'
    )
    text = edit(STOCK, wildcard, "")

    assert problems_of(text) == [
        (
            line_of(text, "call_llm  "),
            "phase 'call_llm' takes no injected message, but ends the run in"
            " 'done' on 'model_replied': a message injected while the run is in"
            " 'call_llm' waits for a phase that takes it, and the run would end"
            " done without it, never heard nor kept; give 'call_llm' a"
            " 'message_injected' transition (the stock file's source = \"*\" one,"
            ' with actions = ["record_injection"])',
        )
    ]
    # The phases that end the run done take it: a message waits elsewhere
    # only until the run comes to one of them.
    assert MachineSpec.from_toml(
        edit(STOCK, wildcard, wildcard.replace('"*"', '"call_llm"'))
    ).states


def test_a_pause_that_takes_no_injection_is_refused() -> None:
    """A message injected before the run pauses there waited outside the run.

    It loaded: the message waited in the `RunControl` while the run paused,
    and the run, answered (under another control), ended done without it.
    """
    approval = (machines_dir() / "approval.toml").read_text()
    text = edit(
        approval,
        '[[transitions]]\ntrigger = "message_injected"\nsource = "*"\n',
        '[[transitions]]\ntrigger = "message_injected"\nsource = ["start",'
        ' "call_llm", "run_tools", "compact", "compact_and_retry"]\n',
    )

    assert problems_of(text) == [
        (
            line_of(text, "await_approval    ="),
            "pause phase 'await_approval' takes no injected message: a message"
            " injected before the run pauses there waits for a phase that takes"
            " it, and the run pauses, and goes on once answered, without it,"
            " never heard nor kept; give 'await_approval' a 'message_injected'"
            ' transition (the stock file\'s source = "*" one, with actions ='
            ' ["record_injection"])',
        )
    ]


def test_a_measuring_phase_that_flushes_only_sometimes_may_hold_a_message() -> None:
    """A guarded flush leaves the rest to the wildcard's, which only records."""
    text = edit(
        STOCK,
        'source = "start"\nactions = ["record_injection", "flush_inbox"]',
        'source = "start"\nconditions = ["has_tool_calls"]\n'
        'actions = ["record_injection", "flush_inbox"]',
    )
    # Ending done at the turn limit, from `start`: what waits there is lost.
    text = edit(
        text,
        'dest = "failed"\nconditions = ["is_turn_limit_reached"]\n'
        'error = "max_turns_exceeded"',
        'dest = "done"\nconditions = ["is_turn_limit_reached"]',
    )

    assert [m for _, m in problems_of(text)] == [
        "phase 'start' on 'measured' ends the run in 'done' though a message"
        " injected there may wait, never heard: put before it a transition on"
        " 'measured' with conditions = ['has_injected_messages'] into another"
        " phase (the stock file's goes to 'start', where the model hears it)"
    ]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (
            'conditions = ["has_tool_calls"]\n',
            'conditions = ["has_tool_calls", "is_over_threshold_line"]\n',
        ),
        (
            'conditions = ["has_tool_calls"]\n',
            'conditions = ["has_tool_calls"]\nunless = ["has_injected_messages"]\n',
        ),
    ],
    ids=["narrowed", "unless"],
)
def test_a_reply_whose_calls_may_skip_the_tools_is_refused(old: str, new: str) -> None:
    """A reply's calls left unanswered on the way to done: a run would fail there."""
    text = edit(STOCK, old, new)

    assert [m for _, m in problems_of(text)] == [
        "phase 'call_llm' on 'model_replied' enters 'start' with the reply's tool"
        " calls unanswered: put before it a transition on 'model_replied' with"
        " conditions = ['has_tool_calls'] into a phase that answers them (a"
        " run_tools phase, or one that pauses for a review), or add"
        " 'has_tool_calls' to its unless",
        "phase 'call_llm' on 'model_replied' enters 'done' with the reply's tool"
        " calls unanswered: put before it a transition on 'model_replied' with"
        " conditions = ['has_tool_calls'] into a phase that answers them (a"
        " run_tools phase, or one that pauses for a review), or add"
        " 'has_tool_calls' to its unless",
    ]


def test_a_finish_transition_unless_a_message_waits_will_do() -> None:
    text = edit(
        STOCK,
        HEARD + ENDS + '\nactions = ["record_reply"]\n',
        ENDS + '\nunless = ["has_injected_messages"]\nactions = ["record_reply"]\n\n'
        '[[transitions]]\ntrigger = "model_replied"\nsource = "call_llm"\n'
        'dest = "start"\nactions = ["record_reply"]\n',
    )

    assert MachineSpec.from_toml(text).name == "turn"


def test_the_shipped_review_machine_hears_what_waits_for_the_review() -> None:
    review = (machines_dir() / "review.toml").read_text()
    heard = (
        '[[transitions]]\ntrigger = "approved"\nsource = "await_review"\n'
        'dest = "start"\nconditions = ["has_injected_messages"]\n\n'
    )

    assert [m for _, m in problems_of(edit(review, heard, ""))] == [
        "phase 'await_review' on 'approved' ends the run in 'done' though a"
        " message injected there may wait, never heard: put before it a"
        " transition on 'approved' with conditions = ['has_injected_messages']"
        " into another phase (the stock file's goes to 'start', where the model"
        " hears it)"
    ]


def test_a_misspelt_key_is_read_as_the_key_it_is_closest_to() -> None:
    # One typo, one problem: the rules see on_enter as written under on_entre.
    text = edit(
        STOCK,
        'done              = { decision = "finish", on_enter = ["commit_pending"] }',
        'done              = { decision = "finish", on_entre = ["commit_pending"] }',
    )

    assert [m for _, m in problems_of(text)] == ["state 'done': unknown key 'on_entre'"]


def test_a_machine_changed_by_hand_is_checked_when_a_driver_takes_it() -> None:
    stock = load_machine(machines_dir() / "turn.toml")
    no_start = attrs.evolve(stock, transitions=stock.transitions[1:])
    renamed = attrs.evolve(stock, name="mine")

    with pytest.raises(DefinitionError) as error:
        Driver(model=ScriptedModel.of("hi"), machine=no_start)

    assert str(error.value) == (
        "<MachineSpec 'turn'>: the initial phase 'start' has no 'run_started'"
        " transition: no run could start"
    )
    assert Driver(model=ScriptedModel.of("hi"), machine=renamed).machine is renamed


def test_a_loaded_machine_is_not_checked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    stock = load_machine(machines_dir() / "turn.toml")
    checked = stock.validated()  # a copy made by hand: checked once, here
    by_hand = attrs.evolve(stock, name="by hand").validated()

    def refuse(*args: object, **kwargs: object) -> MachineSpec:
        raise AssertionError("checked again")

    monkeypatch.setattr(_loader, "load_spec", refuse)

    assert stock.validated() is stock is checked
    assert by_hand.validated() is by_hand


def test_hearing_a_message_where_nothing_flushes_it_is_refused() -> None:
    # Without `flush_inbox` on `start`, a message injected during a model call
    # waits for ever: each reply sees it waiting and goes back to `start`,
    # the model is called without it, and the run fails at max_turns.
    text = edit(
        STOCK,
        'start             = { decision = "measure", on_enter = ["flush_inbox"] }',
        'start             = { decision = "measure" }',
    )

    assert problems_of(text) == [
        (
            line_of(text, 'conditions = ["has_injected_messages"]') - 4,
            "phase 'call_llm' on 'model_replied': when a message waits, the run"
            " goes on to 'start' and the next model call without moving it into"
            " the request, so the model never hears it and the run loops until"
            " max_turns: add 'flush_inbox' to the on_enter of the measure phase on"
            " the way (the stock file's 'start' has it)",
        )
    ]


def test_hearing_a_message_through_a_phase_of_its_own_will_do() -> None:
    # The waiting message goes through a custom phase to `start`, which
    # moves it into the request before the next model call.
    text = edit(STOCK, 'name = "turn"', 'name = "turn"\nsignals = ["noted"]')
    text = edit(text, "[states]\n", '[states]\nnote = { effect = "note" }\n')
    text = edit(
        text,
        'dest = "start"\nconditions = ["has_injected_messages"]',
        'dest = "note"\nconditions = ["has_injected_messages"]',
    )
    text += '\n[[transitions]]\ntrigger = "noted"\nsource = "note"\ndest = "start"\n'

    assert MachineSpec.from_toml(text).state("note").effect == "note"


def test_a_finish_unless_a_message_waits_needs_a_flush_after_it_too() -> None:
    # The reply ends the run unless a message waits; then the transition
    # after it goes back to `start`, which must move the message on.
    text = edit(
        STOCK,
        'start             = { decision = "measure", on_enter = ["flush_inbox"] }',
        'start             = { decision = "measure" }',
    )
    text = edit(text, HEARD, "")
    text = edit(
        text,
        'dest = "done"\nactions = ["record_reply"]',
        'dest = "done"\nunless = ["has_injected_messages"]\nactions = ["record_reply"]'
        '\n\n[[transitions]]\ntrigger = "model_replied"\nsource = "call_llm"\n'
        'dest = "start"\nactions = ["record_reply"]',
    )

    assert [m for _, m in problems_of(text)] == [
        "phase 'call_llm' on 'model_replied': when a message waits, the run"
        " goes on to 'start' and the next model call without moving it into"
        " the request, so the model never hears it and the run loops until"
        " max_turns: add 'flush_inbox' to the on_enter of the measure phase on"
        " the way (the stock file's 'start' has it)"
    ]


INJECTED = (
    '[[transitions]]\ntrigger = "message_injected"\nsource = "*"\n'
    'actions = ["record_injection"]'
)


def unanswered(phase: str) -> str:
    return (
        f"phase {phase!r} on 'message_injected' leaves for 'start' with the reply's"
        " tool calls unanswered: the message comes before the phase's step, so the"
        " calls would never run and the run would fail; leave out its dest (the"
        " message waits until the run measures again) or go to a fail phase"
    )


@pytest.mark.parametrize(
    ("machine", "phase"),
    [("turn.toml", "run_tools"), ("approval.toml", "await_approval")],
)
def test_an_injection_that_leaves_a_reply_s_calls_unanswered_is_refused(
    machine: str, phase: str
) -> None:
    # It loaded, and every run that got a message while its tools waited
    # failed: "invalid message tool_call.id='c1': a tool call with no result
    # before the next message".
    stock = (machines_dir() / machine).read_text(encoding="utf-8")
    moved = (
        f'[[transitions]]\ntrigger = "message_injected"\nsource = "{phase}"\n'
        'dest = "start"\nactions = ["record_injection", "flush_inbox"]\n\n'
    )
    text = edit(stock, INJECTED, moved + INJECTED)

    line = text[: text.index(moved)].count("\n") + 1
    assert problems_of(text) == [(line, unanswered(phase))]
    # Into a fail phase, or out of a phase that holds no calls, will do.
    MachineSpec.from_toml(
        edit(
            stock,
            INJECTED,
            moved.replace('"start"', '"failed"').replace(
                'actions = ["record_injection", "flush_inbox"]', 'error = "cancelled"'
            )
            + INJECTED,
        )
    )


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (
            '{ decision = true, on_enter = ["commit_pending"] }',
            "state 'done': decision must be one name, a string (decision ="
            ' "NAME"), not a boolean: got True',
        ),
        (
            '{ decision = ["finish"], on_enter = ["commit_pending"] }',
            "state 'done': decision must be one name, a string (decision ="
            " \"finish\"), not a list: got ['finish']",
        ),
    ],
    ids=["a-boolean", "a-list"],
)
def test_a_phase_of_no_kind_is_one_problem_not_also_its_commit(
    body: str, problem: str
) -> None:
    # Its commit_pending was reported too: "it may run only on the way into a
    # finish phase", of the phase meant to be one.
    text = edit(
        STOCK,
        'done              = { decision = "finish", on_enter = ["commit_pending"] }',
        f"done              = {body}",
    )

    assert problems_of(text) == [(line_of(text, "done              ="), problem)]


def test_a_machine_no_run_can_end_done_is_refused() -> None:
    # It loaded: every run failed, and nothing said was ever kept.
    text = edit(STOCK, 'terminal = ["done", "failed"]', 'terminal = ["failed"]')
    text = edit(
        text,
        'done              = { decision = "finish", on_enter = ["commit_pending"] }\n',
        "",
    )
    text = edit(
        text,
        'source = "call_llm"\ndest = "done"\nactions = ["record_reply"]',
        'source = "call_llm"\ndest = "failed"\nerror = "max_turns_exceeded"',
    )

    assert problems_of(text) == [
        (
            line_of(text, "start             ="),
            "no phase emits finish: no run could end done and keep what was said;"
            ' add one (done = { decision = "finish", on_enter = ["commit_pending"]'
            " }), with a transition into it and its name in terminal",
        )
    ]


REVIEW = (machines_dir() / "review.toml").read_text(encoding="utf-8")
APPROVAL = (machines_dir() / "approval.toml").read_text(encoding="utf-8")
TOOLS_RUN = (
    '[[transitions]]\ntrigger = "tools_finished"\nsource = "run_tools"\n'
    'dest = "start"\nactions = ["record_results"]\n'
)


def entry(text: str, trigger: str, nth: int = 1) -> int:
    """The ``[[transitions]]`` line of the `nth` transition on `trigger`."""
    at = 0
    for _ in range(nth):
        at = line_of(text, trigger, at)
    return at - 1


def leaves(source: str, trigger: str, dest: str, way: str, entered: str) -> str:
    return (
        f"phase {source!r} on {trigger!r} enters {dest!r} with the reply's tool"
        f" calls unanswered: a reply with tool calls comes to {source!r} ({way})"
        " and no run_tools phase runs them on the way, so the run would fail"
        " there (a review answers only the calls it rejects): go into a"
        " run_tools phase first, which runs only the calls still open (none"
        " when every call was rejected), or a fail phase; or send the reply's tool"
        " calls to a run_tools phase (a 'model_replied' transition with"
        f" conditions = ['has_tool_calls'] before the one into {entered!r})"
    )


def test_a_review_the_tool_calls_reach_but_no_tools_follow_is_refused() -> None:
    # It loaded, and every run whose model asked for a tool failed after the
    # review: "a tool call with no result before the next message".
    text = edit(REVIEW, 'run_tools         = { decision = "run_tools" }\n', "")
    text = edit(text, "\n" + TOOLS_RUN, "")
    text = edit(
        text,
        'source = "call_llm"\ndest = "run_tools"',
        'source = "call_llm"\ndest = "await_review"',
    )
    way = "'call_llm' -> 'await_review'"

    assert problems_of(text) == [
        (
            entry(text, 'trigger = "approved"'),
            leaves("await_review", "approved", "start", way, "await_review"),
        ),
        (
            entry(text, 'trigger = "approved"', 2),
            leaves("await_review", "approved", "done", way, "await_review"),
        ),
        (
            entry(text, 'trigger = "revise"'),
            leaves("await_review", "revise", "start", way, "await_review"),
        ),
    ]


def test_a_review_that_goes_back_to_the_model_without_the_tools_is_refused() -> None:
    # The reviewer's rejections go back to the model: a call it approved
    # was never run, and the run failed on the next request.
    text = edit(
        APPROVAL,
        'source = "await_approval"\ndest = "run_tools"',
        'source = "await_approval"\ndest = "start"',
    )
    text = edit(text, "\n" + TOOLS_RUN, "")
    text = edit(text, 'run_tools         = { decision = "run_tools" }\n', "")

    assert problems_of(text) == [
        (
            entry(text, 'trigger = "tool_calls_reviewed"'),
            leaves(
                "await_approval",
                "tool_calls_reviewed",
                "start",
                "'call_llm' -> 'await_approval'",
                "await_approval",
            ),
        )
    ]


def test_the_calls_are_followed_through_the_phases_before_the_tools() -> None:
    # A second check after the reviewer's: its signal leaves for the model.
    text = edit(
        APPROVAL,
        'source = "await_approval"\ndest = "run_tools"',
        'source = "await_approval"\ndest = "check"',
    )
    text = edit(text, "[states]\n", '[states]\ncheck = { effect = "check" }\n')
    text = edit(text, "[states]\n", 'signals = ["ok"]\n\n[states]\n')
    text += (
        '\n[[transitions]]\ntrigger = "ok"\nsource = "check"\ndest = "start"\n'
        '\n[[transitions]]\ntrigger = "tool_calls_reviewed"\nsource = "check"\n'
        'dest = "run_tools"\nactions = ["record_review"]\n'
    )

    assert problems_of(text) == [
        (
            entry(text, 'trigger = "ok"'),
            leaves(
                "check",
                "ok",
                "start",
                "'call_llm' -> 'await_approval' -> 'check'",
                "await_approval",
            ),
        )
    ]


def test_a_phase_of_one_s_own_after_the_tools_ran_will_do() -> None:
    # The tools ran: a check of their results may go back to the model, or
    # end the run (the run's work was the tools').
    text = edit(REVIEW, TOOLS_RUN, TOOLS_RUN.replace('"start"', '"await_review"'))

    assert MachineSpec.from_toml(text).name == "review"


def test_a_review_of_the_calls_before_the_tools_run_will_do() -> None:
    # The allowlist of the page on writing machines: rejected calls are
    # answered by the review, the others run.
    text = edit(STOCK, "[states]\n", '[states]\ncheck = { effect = "check" }\n')
    text = edit(text, 'call_llm"\ndest = "run_tools"', 'call_llm"\ndest = "check"')
    text += (
        '\n[[transitions]]\ntrigger = "tool_calls_reviewed"\nsource = "check"\n'
        'dest = "run_tools"\nactions = ["record_review"]\n'
    )

    assert MachineSpec.from_toml(text).name == "turn"


@pytest.mark.parametrize(
    ("trigger", "dest"),
    [
        ("compaction_noop", "start"),
        ("measured", "call_llm"),
        ("output_rejected", "start"),
    ],
)
def test_an_effect_s_own_event_that_leaves_the_calls_unanswered_is_refused(
    trigger: str, dest: str
) -> None:
    # An effect may return any event: one named on the way out of the phase
    # the reply's calls reach went on with them unanswered, and every run
    # whose model asked for a tool failed there.
    text = edit(STOCK, "[states]\n", '[states]\ncheck = { effect = "check" }\n')
    text = edit(text, 'call_llm"\ndest = "run_tools"', 'call_llm"\ndest = "check"')
    text += (
        '\n[[transitions]]\ntrigger = "tool_calls_reviewed"\nsource = "check"\n'
        'dest = "run_tools"\nactions = ["record_review"]\n'
        f'\n[[transitions]]\ntrigger = "{trigger}"\nsource = "check"\n'
        f'dest = "{dest}"\n'
    )

    last = text.rindex("[[transitions]]")  # the one out of the effect's phase
    assert (
        text.count("\n", 0, last) + 1,
        leaves("check", trigger, dest, "'call_llm' -> 'check'", "check"),
    ) in problems_of(text)


def test_a_review_of_replies_without_calls_written_first_will_do() -> None:
    # Every final answer is reviewed (a message injected meanwhile is heard
    # after the review); the replies with calls go on to the tools.
    replied = '[[transitions]]\ntrigger = "model_replied"\nsource = "call_llm"\n'
    start = REVIEW.index(replied)
    end = REVIEW.index(replied + 'dest = "await_review"')
    text = REVIEW[:start] + REVIEW[end:]
    text = edit(
        text,
        'dest = "await_review"\nactions = ["record_reply"]\n',
        'dest = "await_review"\nunless = ["has_tool_calls"]\n'
        'actions = ["record_reply"]\n\n'
        f'{replied}dest = "run_tools"\nactions = ["record_reply"]\n',
    )

    assert MachineSpec.from_toml(text).name == "review"


@pytest.mark.parametrize(
    ("machine", "phase", "dest", "extra"),
    [
        ("turn.toml", "compact", "start", ', "count_compaction"'),
        ("review.toml", "await_review", "start", ""),
    ],
)
def test_an_injection_that_moves_a_run_on_while_its_step_runs_is_refused(
    machine: str, phase: str, dest: str, extra: str
) -> None:
    # It loaded, and a message injected while the phase's step ran crashed
    # the run: the step's outcome came to a phase that does not take it.
    stock = (machines_dir() / machine).read_text(encoding="utf-8")
    moved = (
        f'[[transitions]]\ntrigger = "message_injected"\nsource = "{phase}"\n'
        f'dest = "{dest}"\nactions = ["record_injection"{extra}]\n\n'
    )
    text = edit(stock, INJECTED, moved + INJECTED)

    line = text[: text.index(moved)].count("\n") + 1
    assert problems_of(text) == [
        (
            line,
            f"phase {phase!r} on 'message_injected' leaves for {dest!r} while its"
            " step is under way: the step's outcome would come to a phase that"
            " does not take it, and the run would crash; leave out its dest (the"
            " message waits in the inbox until the run measures again) or go to"
            " a fail phase",
        )
    ]


def test_an_injection_may_answer_a_pause_by_moving_the_run_on() -> None:
    # A paused phase runs no step: the message is its answer.
    stock = (machines_dir() / "review.toml").read_text(encoding="utf-8")
    paused = edit(
        stock,
        'await_review      = { effect = "review" }',
        'await_review      = { decision = "pause" }',
    )
    moved = (
        '[[transitions]]\ntrigger = "message_injected"\nsource = "await_review"\n'
        'dest = "start"\nactions = ["record_injection"]\n\n'
    )
    MachineSpec.from_toml(edit(paused, INJECTED, moved + INJECTED))
