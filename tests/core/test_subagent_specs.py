"""Sub-agents a machine file declares: read, checked and loaded with the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from turnfsm import load_machine, machines_dir
from turnfsm.core import MachineSpec, SubagentSpec, render_mermaid
from turnfsm.errors import DefinitionError
from turnfsm.persistence import machine_digest

REVIEW = (machines_dir() / "review.toml").read_text()

CRITIC = """
[subagents.critic]
machine = "{machine}"
task = "Review: {{reply}} (asked: {{request}})"
signal = "revise"
key = "feedback"
routes = {{ approved = "APPROVED" }}
max_children = 3
"""


def reviewed(machine: str = "turn.toml", name: str = "reviewed") -> str:
    """The review machine with its review phase running the sub-agent `critic`."""
    text = REVIEW.replace('name = "review"', f'name = "{name}"').replace(
        'await_review      = { effect = "review" }',
        'await_review      = { subagent = "critic" }',
    )
    return text + CRITIC.format(machine=machine)


def problems(text: str, tmp_path: Path, name: str = "m.toml") -> list[str]:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(DefinitionError) as caught:
        load_machine(path)
    return [f"{p.line}: {p}" for p in caught.value.problems]


def test_a_declared_sub_agent_loads_with_its_machine(tmp_path: Path) -> None:
    path = tmp_path / "reviewed.toml"
    path.write_text(reviewed())
    spec = load_machine(path)

    assert spec.subagents == (
        SubagentSpec(
            name="critic",
            machine="turn.toml",
            signal="revise",
            key="feedback",
            task="Review: {reply} (asked: {request})",
            max_children=3,
            routes=(("approved", "APPROVED"),),
        ),
    )
    assert spec.state("await_review").subagent == "critic"
    assert spec.state("await_review").effect == "critic"
    # The shipped machine, found by name: it is the stock one.
    assert machine_digest(spec.children["critic"]) == machine_digest(
        load_machine(machines_dir() / "turn.toml")
    )


def test_the_declaration_round_trips_with_the_same_digest(tmp_path: Path) -> None:
    path = tmp_path / "reviewed.toml"
    path.write_text(reviewed())
    spec = load_machine(path)
    again = MachineSpec.from_dict(spec.to_dict())

    assert again.to_dict() == spec.to_dict()
    assert machine_digest(again) == machine_digest(spec)
    assert again.children == {}  # data alone loads no files
    assert spec.to_dict()["subagents"] == {
        "critic": {
            "machine": "turn.toml",
            "signal": "revise",
            "key": "feedback",
            "task": "Review: {reply} (asked: {request})",
            "max_children": 3,
            "routes": {"approved": "APPROVED"},
        }
    }


def test_a_relative_machine_file_is_read_beside_the_declaring_one(
    tmp_path: Path,
) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "child.toml").write_text(
        (machines_dir() / "turn.toml")
        .read_text()
        .replace('name = "turn"', 'name = "child"')
    )
    path = tmp_path / "reviewed.toml"
    path.write_text(reviewed("sub/child.toml"))
    assert load_machine(path).children["critic"].name == "child"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            ('signal = "revise"', 'signal = "revised"'),
            "sub-agent 'critic': signal 'revised' is not one of the machine's"
            " signals (did you mean 'revise'?)",
        ),
        (
            ("{reply}", "{answer}"),
            "sub-agent 'critic': task names {answer}, which is none of {reply},"
            " {request}",
        ),
        (
            ("{reply}", "{reply"),
            "sub-agent 'critic': task is no template (",
        ),
        (
            ("max_children = 3", "max_children = 0"),
            "sub-agent 'critic': max_children must be an integer from 1 to"
            " 1,000,000, got 0",
        ),
        (
            ('approved = "APPROVED"', 'approved = ""'),
            "sub-agent 'critic': route 'approved' must be a non-empty text (how"
            " the answer begins), got ''",
        ),
        (
            ('machine = "turn.toml"', 'machine = "missing.toml"'),
            "sub-agent 'critic': machine 'missing.toml' cannot be read: No such"
            " file or directory",
        ),
        (
            ('key = "feedback"', 'key = "feedback"\ntsak = "x"'),
            "sub-agent 'critic': unknown key 'tsak' (did you mean 'task'?)",
        ),
        (
            ("{reply}", "{reply!r}"),
            "sub-agent 'critic': task writes {reply!r}: a field is only {request}"
            " or {reply}, with no conversion or format",
        ),
        (
            ("{reply}", "{reply:>10}"),
            "sub-agent 'critic': task writes {reply:>10}: a field is only"
            " {request} or {reply}, with no conversion or format",
        ),
        (
            ('key = "feedback"', 'key = "answer"'),
            "sub-agent 'critic': its answer is the signal's data['answer'], but"
            " the 'revise' transition from 'await_review' adds data['feedback']:"
            " write key = 'feedback'",
        ),
        (
            ('{ subagent = "critic" }', '{ subagent = "critics" }'),
            "state 'await_review': unknown sub-agent 'critics' (declare it under"
            " [subagents]) (did you mean 'critic'?)",
        ),
    ],
)
def test_each_bad_declaration_is_a_problem_on_its_line(
    tmp_path: Path, change: tuple[str, str], expected: str
) -> None:
    text = reviewed()
    assert change[0] in text
    found = problems(text.replace(*change), tmp_path)
    assert len(found) == 1, found
    line, message = found[0].split(": ", 1)
    assert message.startswith(expected)
    assert line != "None"


def test_a_signal_the_phase_does_not_leave_on_is_refused(tmp_path: Path) -> None:
    text = (
        reviewed()
        .replace(
            'signals = ["approved", "revise"]', 'signals = ["approved", "revise", "x"]'
        )
        .replace('routes = { approved = "APPROVED" }', 'routes = { x = "X" }')
    )
    found = problems(text, tmp_path)
    assert any(
        "state 'await_review' runs sub-agent 'critic', which ends with 'x', but no"
        " transition from 'await_review' takes 'x'" in p
        for p in found
    ), found


def test_a_sub_agent_no_phase_runs_is_refused(tmp_path: Path) -> None:
    text = reviewed() + CRITIC.replace("critic", "idle").format(machine="turn.toml")
    found = problems(text, tmp_path)
    assert any(
        "sub-agent 'idle' is declared but no phase runs it" in p for p in found
    ), found


def test_a_machine_that_runs_its_caller_is_refused(tmp_path: Path) -> None:
    # a.toml runs b.toml, which runs a.toml again.
    (tmp_path / "b.toml").write_text(reviewed("a.toml", name="b"))
    found = problems(reviewed("b.toml", name="a"), tmp_path, name="a.toml")
    assert len(found) == 1
    assert "a machine cannot run its own caller as a sub-agent" in found[0]
    assert "(a.toml > b.toml > a.toml)" in found[0]
    assert found[0].startswith(str(problems_line(reviewed(), "machine = ")))


def problems_line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_an_invalid_child_machine_is_a_problem_of_the_caller(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text('name = "bad"\n')
    found = problems(reviewed("bad.toml"), tmp_path)
    assert len(found) == 1
    assert found[0].startswith(
        f"{problems_line(reviewed(), 'machine = ')}: sub-agent 'critic': machine"
        " 'bad.toml' ("
    )
    assert "more problem" in found[0]


def test_a_sub_agent_deeper_than_its_max_depth_is_refused(tmp_path: Path) -> None:
    # leaf's critic may run one deep: alone, leaf loads; run by top, the
    # critic would run two deep.
    (tmp_path / "leaf.toml").write_text(
        reviewed("turn.toml", name="leaf").replace(
            "max_children = 3", "max_children = 3\nmax_depth = 1"
        )
    )
    assert load_machine(tmp_path / "leaf.toml").children["critic"].name == "turn"
    found = problems(reviewed("leaf.toml", name="top"), tmp_path, name="top.toml")
    assert found == [
        f"{problems_line(reviewed(), 'machine = ')}: sub-agent 'critic': sub-agent"
        " critic > critic runs 2 deep, past its max_depth = 1"
    ]


def test_a_cycle_through_a_sub_agent_phase_must_be_bounded(tmp_path: Path) -> None:
    # The critic's revise goes straight back to the review: no model call.
    text = reviewed().replace(
        'trigger = "revise"\nsource = "await_review"\ndest = "start"',
        'trigger = "revise"\nsource = "await_review"\ndest = "await_review"',
    )
    assert text != reviewed()
    found = problems(text, tmp_path)
    assert any(
        "cycle await_review -[revise]-> await_review is not bounded" in p for p in found
    ), found


def test_a_specs_digest_is_computed_once_and_equal_specs_agree(tmp_path: Path) -> None:
    path = tmp_path / "reviewed.toml"
    path.write_text(reviewed())
    spec, again = load_machine(path), load_machine(path)
    assert spec is not again
    assert machine_digest(spec) == machine_digest(again)
    assert machine_digest(spec) is machine_digest(spec)
    other = load_machine(machines_dir() / "turn.toml")
    assert machine_digest(other) != machine_digest(spec)


@pytest.mark.parametrize("name", ["run_tools", "call_llm", " "])
def test_a_sub_agent_needs_a_name_of_its_own(tmp_path: Path, name: str) -> None:
    text = (
        reviewed()
        .replace('"critic"', f'"{name}"')
        .replace("[subagents.critic]", f'[subagents."{name}"]')
    )
    assert problems(text, tmp_path) == [
        f"{problems_line(text, '[subagents.')}: sub-agent {name!r}: a sub-agent"
        " needs a name of its own (not empty, not a decision's: its effect would"
        " replace the built-in one)"
    ]


def test_an_effect_named_as_a_sub_agent_is_refused(tmp_path: Path) -> None:
    text = reviewed().replace("[states]\n", '[states]\nodd = { effect = "critic" }\n')
    found = problems(text, tmp_path)
    assert any(
        "state 'odd': effect 'critic' is the name of a sub-agent: write subagent"
        " = 'critic' to run it" in p
        for p in found
    ), found


TWO = """
name = "two"
initial = "start"
terminal = ["done", "failed"]
signals = ["ok"]

[states]
start = { decision = "measure" }
first = { subagent = "a" }
second = { subagent = "b" }
done = { decision = "finish", on_enter = ["commit_pending"] }
failed = { decision = "fail" }

[[transitions]]
trigger = "run_started"
source = "start"
actions = ["record_start"]

[[transitions]]
trigger = "measured"
source = "start"
dest = "failed"
conditions = ["is_turn_limit_reached"]
error = "max_turns_exceeded"

[[transitions]]
trigger = "measured"
source = "start"
dest = "first"

[[transitions]]
trigger = "ok"
source = "first"
dest = "second"

[[transitions]]
trigger = "ok"
source = "second"
dest = "done"

[[transitions]]
trigger = "run_cancelled"
source = "*"
dest = "failed"
error = "cancelled"

[subagents.a]
machine = "turn.toml"
signal = "ok"

[subagents.b]
machine = "turn.toml"
signal = "ok"
max_depth = 2
"""


def test_a_file_two_sub_agents_name_is_read_once(tmp_path: Path) -> None:
    (tmp_path / "two.toml").write_text(TWO)
    (tmp_path / "top.toml").write_text(reviewed("two.toml", name="top"))
    two = load_machine(tmp_path / "top.toml").children["critic"]
    assert two.children["a"] is two.children["b"]
    # The diagram names each phase's sub-agent and its machine file.
    assert "sub-agent a (turn.toml)" in render_mermaid(two)
    assert two.subagent("b").max_depth == 2
    assert two.to_dict()["subagents"] == {
        "a": {"machine": "turn.toml", "signal": "ok"},
        "b": {"machine": "turn.toml", "signal": "ok", "max_depth": 2},
    }


def test_a_sub_agent_two_files_down_past_its_max_depth_is_refused(
    tmp_path: Path,
) -> None:
    # top > mid > two: two's sub-agent b may run two deep; under top it
    # would run three deep.
    (tmp_path / "two.toml").write_text(TWO)
    (tmp_path / "mid.toml").write_text(reviewed("two.toml", name="mid"))
    assert load_machine(tmp_path / "mid.toml").name == "mid"  # b runs 3 deep: no
    found = problems(reviewed("mid.toml", name="top"), tmp_path, name="top.toml")
    assert found == [
        f"{problems_line(reviewed(), 'machine = ')}: sub-agent 'critic': sub-agent"
        " critic > critic > b runs 3 deep, past its max_depth = 2"
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("subagents = 1\n", "'subagents' must be a table"),  # placed at the top
        ("[subagents]\ncritic = 1\n", "sub-agent 'critic' must be a table"),
        (
            '[subagents.critic]\nsignal = "revise"\n',
            "sub-agent 'critic': machine is missing",
        ),
        (
            '[subagents.critic]\nmachine = 3\nsignal = "revise"\n',
            "sub-agent 'critic': machine must be a non-empty string, got 3",
        ),
        (
            '[subagents.critic]\nmachine = "turn.toml"\nsignal = "revise"\n'
            'key = "feedback"\nroutes = 1\n',
            "sub-agent 'critic': routes must be a table of signal = prefix, got 1",
        ),
    ],
)
def test_a_sub_agents_table_of_the_wrong_shape_is_refused(
    tmp_path: Path, text: str, expected: str
) -> None:
    base = reviewed()
    base = base[: base.index("\n[subagents.critic]")]
    if not text.startswith("["):  # a top-level key goes before the tables
        base = text + base
        text = ""
    found = problems(base + "\n" + text, tmp_path)
    assert any(expected in p for p in found), found


def test_a_phase_with_a_decision_and_a_sub_agent_is_refused(tmp_path: Path) -> None:
    text = reviewed().replace(
        '{ subagent = "critic" }', '{ decision = "finish", subagent = "critic" }'
    )
    found = problems(text, tmp_path)
    assert any(
        "state 'await_review': give exactly one of decision / effect / subagent" in p
        for p in found
    ), found


def test_a_resolver_of_your_own_loads_the_sub_agents_machines(tmp_path: Path) -> None:
    (tmp_path / "two.toml").write_text(TWO)
    two = load_machine(tmp_path / "two.toml")
    asked: list[str] = []

    def resolve(name: str) -> MachineSpec:
        asked.append(name)
        return MachineSpec.from_dict(two.to_dict())  # its own children not loaded

    spec = MachineSpec.from_toml(reviewed("two.toml", name="top"), resolve=resolve)
    assert asked == ["two.toml"]
    assert spec.children["critic"].children == {}
    # Without a resolver, nothing is loaded and nothing below is checked.
    assert MachineSpec.from_toml(reviewed("nowhere.toml")).children == {}


def test_a_phase_with_an_effect_and_a_sub_agent_is_refused(tmp_path: Path) -> None:
    text = reviewed().replace(
        '{ subagent = "critic" }', '{ effect = "review", subagent = "critic" }'
    )
    found = problems(text, tmp_path)
    assert any(
        "state 'await_review': give exactly one of decision / effect / subagent" in p
        for p in found
    ), found
