"""Every machine that loads keeps the promises: the shipped ones, changed at random.

`test_machine_mutants` runs every single change of a shipped machine through
seven scripted runs. Here hypothesis stacks several changes on one of the four
shipped machines (a transition dropped, moved within its group, sent
elsewhere; a guard or reducer added or removed; a phase added as a copy of
another with ways in and out, renamed, or given another decision; the
terminal list changed), and runs each machine that loads through the driver
properties' adversarial scenarios (`scenarios`), with their checks
(`keeps_the_promises`). Most changes are refused at load, as they should be;
`MIN_LOADED` of them at least load, so the runs are not empty.
"""

from __future__ import annotations

import copy
import functools
import tomllib
from collections.abc import Callable
from typing import Any, TypeAlias

from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from tests.driver.test_driver_properties import keeps_the_promises, scenarios
from tests.profiles import heavy
from turnfsm._resources import machines_dir
from turnfsm.core import GUARDS, REDUCERS, MachineSpec
from turnfsm.errors import DefinitionError

Data: TypeAlias = dict[str, Any]
Change: TypeAlias = Callable[[st.DrawFn, Data], str | None]

BASES = ("turn", "approval", "compaction", "review")
DECISIONS = ("measure", "call_llm", "run_tools", "compact", "finish", "fail", "pause")
WILDCARD = "*"


@functools.cache
def _shipped(name: str) -> Data:
    return tomllib.loads((machines_dir() / f"{name}.toml").read_text())


def _sources(t: Data) -> list[str]:
    source = t["source"]
    return [source] if isinstance(source, str) else list(source)


def _index(draw: st.DrawFn, items: list[Any]) -> int | None:
    return draw(st.integers(0, len(items) - 1)) if items else None


# -- the changes: each edits `data` in place and says what it did, or None ----


def drop(draw: st.DrawFn, data: Data) -> str | None:
    i = _index(draw, data["transitions"])
    if i is None:
        return None
    del data["transitions"][i]
    return f"drop #{i}"


def reorder(draw: st.DrawFn, data: Data) -> str | None:
    """Move a transition before or after another of its (phase, trigger) group."""
    ts = data["transitions"]
    i = _index(draw, ts)
    if i is None:
        return None
    mine = set(_sources(ts[i]))
    group = [
        j
        for j, t in enumerate(ts)
        if j != i
        and t["trigger"] == ts[i]["trigger"]
        and (mine & set(_sources(t)) or WILDCARD in mine | set(_sources(t)))
    ]
    if not group:
        return None
    j = draw(st.sampled_from(group))
    ts.insert(j, ts.pop(i))
    return f"move #{i} to #{j}"


def retarget(draw: st.DrawFn, data: Data) -> str | None:
    i = _index(draw, data["transitions"])
    if i is None:
        return None
    dest = draw(st.sampled_from([*data["states"], None]))
    t = data["transitions"][i]
    t.pop("dest", None)
    if dest is not None:
        t["dest"] = dest
    return f"#{i} dest={dest}"


def _add_name(key: str, table: Any) -> Change:
    def add(draw: st.DrawFn, data: Data) -> str | None:
        i = _index(draw, data["transitions"])
        if i is None:
            return None
        name = draw(st.sampled_from(sorted(table)))
        data["transitions"][i].setdefault(key, []).append(name)
        return f"#{i} +{key} {name}"

    return add


def _drop_name(keys: tuple[str, ...]) -> Change:
    def remove(draw: st.DrawFn, data: Data) -> str | None:
        named = [
            (i, key, j)
            for i, t in enumerate(data["transitions"])
            for key in keys
            for j in range(len(t.get(key, [])))
        ]
        if not named:
            return None
        i, key, j = draw(st.sampled_from(named))
        name = data["transitions"][i][key].pop(j)
        return f"#{i} -{key} {name}"

    return remove


def _fresh(data: Data, stem: str) -> str:
    n = 2
    while f"{stem}_{n}" in data["states"]:
        n += 1
    return f"{stem}_{n}"


def add_phase(draw: st.DrawFn, data: Data) -> str | None:
    """Add a copy of a phase: its decision, its transitions out, one way in."""
    phase = draw(st.sampled_from(sorted(data["states"])))
    new = _fresh(data, phase)
    data["states"][new] = copy.deepcopy(data["states"][phase])
    copies = [
        {**copy.deepcopy(t), "source": new}
        for t in data["transitions"]
        if phase in _sources(t)
    ]
    data["transitions"].extend(copies)
    if phase in data.get("terminal", []):
        data["terminal"].append(new)
    into = [i for i, t in enumerate(data["transitions"]) if t.get("dest") == phase]
    if into:
        i = draw(st.sampled_from(into))
        data["transitions"][i]["dest"] = new
        return f"{new} = copy of {phase}, entered by #{i}"
    return f"{new} = copy of {phase}"


def rename_phase(draw: st.DrawFn, data: Data) -> str | None:
    phase = draw(st.sampled_from(sorted(data["states"])))
    new = _fresh(data, "renamed")
    data["states"] = {
        (new if name == phase else name): body for name, body in data["states"].items()
    }
    if data["initial"] == phase:
        data["initial"] = new
    data["terminal"] = [new if p == phase else p for p in data.get("terminal", [])]
    for t in data["transitions"]:
        sources = [new if p == phase else p for p in _sources(t)]
        t["source"] = sources[0] if isinstance(t["source"], str) else sources
        if t.get("dest") == phase:
            t["dest"] = new
    return f"rename {phase} to {new}"


def change_terminal(draw: st.DrawFn, data: Data) -> str | None:
    terminal = data.setdefault("terminal", [])
    phase = draw(st.sampled_from(sorted(data["states"])))
    if phase in terminal:
        terminal.remove(phase)
        return f"terminal -{phase}"
    terminal.append(phase)
    return f"terminal +{phase}"


def change_kind(draw: st.DrawFn, data: Data) -> str | None:
    """Give a phase another decision, or the reviewer's effect."""
    phase = draw(st.sampled_from(sorted(data["states"])))
    body = data["states"][phase]
    for key in ("decision", "effect", "subagent"):
        body.pop(key, None)
    kind = draw(st.sampled_from([*DECISIONS, "effect review"]))
    if kind == "effect review":
        body["effect"] = "review"
    else:
        body["decision"] = kind
    return f"{phase} {kind}"


def change_on_enter(draw: st.DrawFn, data: Data) -> str | None:
    phase = draw(st.sampled_from(sorted(data["states"])))
    on_enter = data["states"][phase].setdefault("on_enter", [])
    if on_enter and draw(st.booleans()):
        return f"{phase} -on_enter {on_enter.pop(_index(draw, on_enter) or 0)}"
    reducer = draw(st.sampled_from(sorted(REDUCERS)))
    on_enter.append(reducer)
    return f"{phase} +on_enter {reducer}"


def change_initial(draw: st.DrawFn, data: Data) -> str | None:
    data["initial"] = draw(st.sampled_from(sorted(data["states"])))
    return f"initial={data['initial']}"


def add_transition(draw: st.DrawFn, data: Data) -> str | None:
    """Copy a transition, from another phase (or every phase) to another."""
    i = _index(draw, data["transitions"])
    if i is None:
        return None
    t = copy.deepcopy(data["transitions"][i])
    phases = sorted(data["states"])
    t["source"] = draw(st.sampled_from([*phases, WILDCARD]))
    t.pop("dest", None)
    dest = draw(st.sampled_from([*phases, None]))
    if dest is not None:
        t["dest"] = dest
    j = draw(st.integers(0, len(data["transitions"])))
    data["transitions"].insert(j, t)
    return f"#{j} = #{i} from {t['source']} to {dest}"


def retrigger(draw: st.DrawFn, data: Data) -> str | None:
    """Have a transition fire on another event (a built-in one or a signal)."""
    i = _index(draw, data["transitions"])
    if i is None:
        return None
    triggers = {t["trigger"] for name in BASES for t in _shipped(name)["transitions"]}
    trigger = draw(st.sampled_from(sorted(triggers | set(data.get("signals", [])))))
    data["transitions"][i]["trigger"] = trigger
    return f"#{i} trigger={trigger}"


def _shipped_values(key: str) -> list[str]:
    return sorted(
        {t[key] for name in BASES for t in _shipped(name)["transitions"] if key in t}
    )


def change_value(draw: st.DrawFn, data: Data) -> str | None:
    """Give a transition an error, a compaction reason or a message, or take it."""
    i = _index(draw, data["transitions"])
    if i is None:
        return None
    key = draw(st.sampled_from(["error", "reason", "message"]))
    t = data["transitions"][i]
    if key in t and draw(st.booleans()):
        del t[key]
        return f"#{i} -{key}"
    t[key] = draw(st.sampled_from(_shipped_values(key)))
    return f"#{i} {key}={t[key]}"


CHANGES: tuple[Change, ...] = (
    drop,
    reorder,
    retarget,
    _add_name("conditions", GUARDS),
    _add_name("unless", GUARDS),
    _drop_name(("conditions", "unless")),
    _add_name("actions", REDUCERS),
    _drop_name(("actions",)),
    add_phase,
    rename_phase,
    change_terminal,
    change_kind,
    change_on_enter,
    change_initial,
    add_transition,
    change_value,
    retrigger,
)


TRIES = 4
"""How many changes are tried for each that must load."""


@st.composite
def changed_machines(draw: st.DrawFn, most: int = 6) -> tuple[list[str], Data]:
    """A shipped machine's data with up to `most` changes; what they were.

    Most single changes are refused at load, so most drawn machines keep
    to the ones that load: a change the loader refuses is undone, and
    another tried (up to `TRIES` times) on the machine that loaded. The rest
    stack their changes whatever the loader says.
    """
    base = draw(st.sampled_from(BASES))
    data = copy.deepcopy(_shipped(base))
    loadable = draw(st.sampled_from([False, True, True]))
    done = [f"{base}.toml" + (", each change loads" if loadable else "")]
    for _ in range(draw(st.integers(1, most))):
        for _attempt in range(TRIES if loadable else 1):
            changed = copy.deepcopy(data)
            said = draw(st.sampled_from(CHANGES))(draw, changed)
            if said is not None and not (loadable and load(changed) is None):
                data = changed
                done.append(said)
                break
    return done, data


def load(data: Data) -> MachineSpec | None:
    """The machine, or None when the loader refuses it (with a typed error)."""
    try:
        return MachineSpec.from_dict(data, source="<changed>")
    except DefinitionError:
        return None


@heavy(2_000)
@given(machine=changed_machines(), s=scenarios())
def test_every_changed_machine_that_loads_keeps_the_promises(
    machine: tuple[list[str], Data], s: dict[str, object]
) -> None:
    changes, data = machine
    note(f"changes: {changes}")
    spec = load(data)
    event("loaded" if spec is not None else "refused")
    if spec is not None:
        keeps_the_promises(spec, s)


MIN_LOADED = 0.4
"""The share of drawn machines that must load for the property to mean much."""


def test_enough_changed_machines_load() -> None:
    loaded: dict[str, list[bool]] = {base: [] for base in BASES}

    @settings(
        max_examples=200,
        database=None,
        derandomize=True,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(machine=changed_machines())
    def draw(machine: tuple[list[str], Data]) -> None:
        changes, data = machine
        loaded[changes[0].split(".")[0]].append(load(data) is not None)

    draw()
    every = [ok for oks in loaded.values() for ok in oks]
    assert sum(every) >= MIN_LOADED * len(every), f"{sum(every)} of {len(every)}"
    assert all(any(oks) for oks in loaded.values()), loaded
