"""Every machine that loads keeps the promises: the shipped ones, changed once.

Each single change of `turn.toml`, `approval.toml` and `review.toml` (whose
reviewer, an effect of the user's, asks for one revision, then approves)
(a transition dropped,
moved, sent elsewhere; a reducer, guard or decision added, removed or
swapped) is loaded; the ones that load run seven scripted runs each (tool
turns, compaction, an overflow, a provider failure, a cancel, injections),
and each run must keep what the driver promises for any machine: it ends, it
never sends a request over the window or one that breaks a tool pair, it
commits what a done run said and nothing of a failed one, a done run's
model heard every injected message, and its session reloads and replays.
The changes that load are many, so a rule the loader lacks shows up here as
the promise it breaks.
"""

from __future__ import annotations

import copy
import functools
import tomllib
from collections.abc import Iterator
from typing import Any

import anyio
import attrs
import pytest

from tests.driver.test_driver_properties import (
    COUNTER,
    approve_after_one_revision,
    request_size,
    run_all,
)
from turnfsm._resources import machines_dir
from turnfsm.context import ContextManager, TruncatingCompactor
from turnfsm.core import (
    GUARDS,
    REDUCERS,
    MachineSpec,
)
from turnfsm.driver import (
    Driver,
    RetryPolicy,
    RunControl,
    Session,
    replay,
)
from turnfsm.errors import (
    CONTEXT_OVERFLOW,
    DefinitionError,
    ProviderError,
    TurnFSMError,
)
from turnfsm.messages import Message, check_history
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import FakeModelClient, reply, tool_call

DECISIONS = ("measure", "call_llm", "run_tools", "compact", "finish", "fail", "pause")
FAMILIES = ("drop", "dest", "actions", "guards", "states")

Data = dict[str, Any]


def _mutants(data: Data, family: str) -> Iterator[tuple[str, Data]]:
    """Every single change of one family to the machine file's data."""
    transitions, states = data["transitions"], data["states"]
    if family == "states":
        for name, body in states.items():
            for reducer in REDUCERS:
                new = copy.deepcopy(data)
                new["states"][name].setdefault("on_enter", []).append(reducer)
                yield f"{name} +on_enter {reducer}", new
            for j, reducer in enumerate(body.get("on_enter", [])):
                new = copy.deepcopy(data)
                del new["states"][name]["on_enter"][j]
                yield f"{name} -on_enter {reducer}", new
            for kind in DECISIONS:
                if body.get("decision") != kind:
                    new = copy.deepcopy(data)
                    new["states"][name]["decision"] = kind
                    yield f"{name} decision={kind}", new
        return
    for i, t in enumerate(transitions):
        if family == "drop":
            new = copy.deepcopy(data)
            del new["transitions"][i]
            yield f"drop #{i}", new
            if i + 1 < len(transitions):
                new = copy.deepcopy(data)
                ts = new["transitions"]
                ts[i], ts[i + 1] = ts[i + 1], ts[i]
                yield f"swap #{i}", new
        elif family == "dest":
            for phase in [*states, None]:
                if t.get("dest") != phase:
                    new = copy.deepcopy(data)
                    new["transitions"][i].pop("dest", None)
                    if phase is not None:
                        new["transitions"][i]["dest"] = phase
                    yield f"#{i} dest={phase}", new
        else:
            keys = ("actions",) if family == "actions" else ("conditions", "unless")
            table = REDUCERS if family == "actions" else GUARDS
            for key in keys:
                for name in table:
                    new = copy.deepcopy(data)
                    new["transitions"][i].setdefault(key, []).append(name)
                    yield f"#{i} +{key} {name}", new
                for j, name in enumerate(t.get(key, [])):
                    new = copy.deepcopy(data)
                    del new["transitions"][i][key][j]
                    yield f"#{i} -{key} {name}", new


@attrs.frozen
class Scenario:
    """What the scripted model does, call by call (by the call's index)."""

    window: int
    outputs: tuple[int, ...]  # a tool call's output size per call, then "final"
    overflow_on: frozenset[int] = frozenset()
    fail_on: frozenset[int] = frozenset()
    cancel_on: int | None = None
    inject_on: frozenset[int] = frozenset()


SCENARIOS = (
    Scenario(4_000, (10, 10)),
    Scenario(800, (600, 600, 600)),
    Scenario(1_500, (10,), overflow_on=frozenset({0}), inject_on=frozenset({1})),
    Scenario(1_500, (10, 10), fail_on=frozenset({1})),
    Scenario(1_500, (10, 10), cancel_on=1, inject_on=frozenset({0})),
    Scenario(300, (2_000,), overflow_on=frozenset({2})),
    # A message injected while the model gives its final answer.
    Scenario(4_000, (10,), inject_on=frozenset({1})),
)


def _broken_promises(spec: MachineSpec, s: Scenario) -> list[str]:
    """Run `s` on `spec`; return each promise the run broke."""
    problems: list[str] = []
    control = RunControl()
    said: list[Message] = []  # every message the model said, in order
    injected: list[Message] = []
    seen: set[str] = set()  # the ids of every message a request carried
    calls = [0]

    def model(request: ModelRequest) -> ModelResponse:
        n = calls[0]
        calls[0] += 1
        if request_size(request) > s.window:
            problems.append(f"call {n}: a request over the {s.window} window")
        try:
            check_history(request.messages)
        except TurnFSMError as exc:
            problems.append(f"call {n}: an invalid request: {exc}")
        seen.update(m.id for m in request.messages)
        if n in s.inject_on:
            injected.append(Message.user(f"note {n}"))
            control.inject(injected[-1])
        if s.cancel_on == n:
            control.cancel("stop")
        if n in s.overflow_on or n in s.fail_on:
            kind = CONTEXT_OVERFLOW if n in s.overflow_on else "bad_request"
            raise ProviderError("refused", kind=kind)
        if n < len(s.outputs):
            message = reply("", tool_call("dump", f"c{n}", size=s.outputs[n]))
        else:
            message = reply("final")
        said.append(message)
        return ModelResponse(message=message)

    async def dump(size: int) -> str:
        """Return `size` characters."""
        return "y" * size

    driver = Driver(
        model=FakeModelClient(model),
        tools=[dump],
        context=ContextManager(
            TruncatingCompactor(preserve_recent=2, min_messages=2),
            context_window=s.window,
            threshold=60,
            counter=COUNTER,
        ),
        max_turns=8,
        retry=RetryPolicy(max_attempts=1),
        machine=spec,
        effects={"review": approve_after_one_revision()}
        if "review" in _effects(spec)
        else {},
    )
    session = Session()
    start = Message.user("start")

    try:
        result = run_all(driver, session, control, start)
    except TimeoutError:
        return ["the run did not end"]
    except Exception as exc:  # what escapes the run is the finding
        return [f"the run raised {type(exc).__name__}: {exc}"]
    covered = {i for run in session.runs for c in run.compactions for i in c.covers}
    kept = {m.id for m in session.history} | covered
    if result.outcome == "done":
        lost = [m.id for m in [start, *said] if m.id not in kept]
        if lost:
            problems.append(f"done, but {lost} were not committed")
        unheard = [m.id for m in injected if m.id not in seen | covered]
        if unheard:
            problems.append(f"done, but injected {unheard} never reached the model")
        if result.text and result.text != said[-1].text:
            problems.append(f"done with {result.text!r}, not the model's last answer")
    elif result.outcome in ("failed", "cancelled"):
        if not isinstance(result.error, TurnFSMError):
            problems.append(f"failed with {result.error!r}")
        if not covered and any(m.id in kept for m in [start, *said]):
            problems.append("failed, but committed what the run said")
    elif result.outcome != "paused":
        problems.append(f"ended {result.outcome}")
    check_history(session.history)
    loaded = anyio.run(Session.load, session.store, session.id)
    if [m.id for m in loaded.history] != [m.id for m in session.history]:
        problems.append("the session reloads with another history")
    for run in loaded.runs:
        if not replay(spec, loaded, run.run_id).ok:
            problems.append(f"run {run.run_id} does not replay")
    return [f"{result.outcome}: {p}" for p in problems]


def _effects(spec: MachineSpec) -> set[str]:
    return {s.effect for s in spec.states if s.effect is not None}


@functools.cache
def _data(name: str) -> Data:
    return tomllib.loads((machines_dir() / f"{name}.toml").read_text())


# Hundreds of machines built and run each: about 7 s for the guards alone,
# 20 s under coverage, three times that on a loaded machine.
@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", ["turn", "approval", "review"])
def test_every_changed_machine_that_loads_keeps_the_promises(
    name: str, family: str
) -> None:
    broken: dict[str, list[str]] = {}
    loaded = 0
    for label, data in _mutants(_data(name), family):
        try:
            spec = MachineSpec.from_dict(data)
        except DefinitionError:
            continue
        loaded += 1
        for n, scenario in enumerate(SCENARIOS):
            for problem in _broken_promises(spec, scenario):
                broken.setdefault(problem, []).append(f"{label} (scenario {n})")
    assert loaded >= 10, f"only {loaded} changes of {name}.toml load: nothing is tried"
    assert not broken, "\n".join(
        f"{problem}: {', '.join(labels[:5])}" for problem, labels in broken.items()
    )
