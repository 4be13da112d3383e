"""The shipped corpus: two long synthetic sessions with planted probes.

`coding` is a tool-heavy coding agent: file reads, test runs, edits, greps
and their errors, over many runs of one session. `chat` is a long planning
conversation with decisions and no tools. Each plants probes of the four
kinds (`PROBE_KINDS`) early and in the middle of the session; the filler
around them never holds a probe's expected strings.

`store_corpus` runs both through a real `Agent` with a scripted model (the
planned replies, in order) and tools that return the planned results, on a
window so large that nothing is compacted: the stored sessions are the
uncompacted record that `evaluate` then replays under each strategy.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, final

import attrs

from turnfsm.agent import Agent
from turnfsm.context import ContextManager, TruncatingCompactor
from turnfsm.driver import Tool, current_tool_call
from turnfsm.evals._probes import Probe, context_text, present
from turnfsm.messages import Message, ToolCallPart
from turnfsm.persistence import Session, SessionStore
from turnfsm.testing import ScriptedModel

__all__ = [
    "CORPUS_SESSIONS",
    "Planned",
    "PlannedRun",
    "corpus_probes",
    "plan_corpus",
    "recorded_tools",
    "store_corpus",
]

CORPUS_SESSIONS: Final = ("corpus-coding", "corpus-chat")
"""The ids of the shipped corpus's sessions."""

RECORD_WINDOW: Final = 1_000_000
"""The window the corpus is recorded on: nothing in it compacts."""


@final
@attrs.frozen
class PlannedRun:
    """One run of a planned session: the user's message, the replies, the results.

    Attributes:
        task: The user's message.
        replies: The model's replies, in order (the last one has no tool call).
        results: Each tool call's result text, by call id.
    """

    task: str
    replies: tuple[Message, ...]
    results: Mapping[str, str]


@final
@attrs.frozen
class Planned:
    """A planned session: its id, system prompt, runs and probes."""

    session_id: str
    system: str
    runs: tuple[PlannedRun, ...]
    probes: tuple[Probe, ...]


# -- the coding session ---------------------------------------------------------

_CODING_PROBES: Final = (
    # (run it is planted in, probe)
    (
        0,
        Probe(
            kind="fact",
            question="Which CI runner image does the project use?",
            expect=("ci-runner:7.3.1-bookworm",),
            session="corpus-coding",
        ),
    ),
    (
        2,
        Probe(
            kind="decision",
            question="What did we decide about the TOML parser, and why?",
            expect=("vendor tomlkit", "Python 3.8"),
            session="corpus-coding",
        ),
    ),
    (
        4,
        Probe(
            kind="artifact",
            question="What state is src/ledger/rounding.py in?",
            expect=("src/ledger/rounding.py", "ROUND_HALF_EVEN"),
            session="corpus-coding",
        ),
    ),
    (
        6,
        Probe(
            kind="fact",
            question="What makes the flaky test fail?",
            expect=("TZ=Pacific/Chatham",),
            session="corpus-coding",
        ),
    ),
    (
        9,
        Probe(
            kind="next_step",
            question="What is still to be done after the rounding fix?",
            expect=("backfill the currency column",),
            session="corpus-coding",
        ),
    ),
    (
        14,
        Probe(
            kind="artifact",
            question="Which migration was written, and is it applied?",
            expect=("0042_add_currency", "not applied"),
            session="corpus-coding",
        ),
    ),
    (
        18,
        Probe(
            kind="decision",
            question="How is the new exporter switched on, and why that way?",
            expect=("feature flag", "rollbacks must not need a deploy"),
            session="corpus-coding",
        ),
    ),
    (
        24,
        Probe(
            kind="next_step",
            question="What must happen before the release is tagged?",
            expect=("rerun the contract tests",),
            session="corpus-coding",
        ),
    ),
)

_SOURCES: Final = tuple(
    f"src/{package}/{module}.py"
    for package, modules in (
        ("ledger", "rounding export accounts journal periods"),
        ("api", "handlers schemas auth pagination errors"),
        ("billing", "invoice tax discounts dunning"),
        ("reports", "monthly quarterly exports"),
    )
    for module in modules.split()
)
_TESTS: Final = tuple(
    f"tests/test_{name}.py"
    for name in ("rounding", "export", "invoice", "handlers", "tax", "monthly")
)
_MODULES: Final = _SOURCES + _TESTS
_WORDS: Final = (
    "amount",
    "total",
    "line",
    "item",
    "account",
    "entry",
    "batch",
    "record",
    "currency",
    "invoice",
    "period",
    "ledger",
    "balance",
    "report",
    "row",
    "column",
    "value",
    "result",
    "payload",
    "request",
)
_CODING_TASKS: Final = (
    "the {test} suite is red, find out why",
    "read {path} and tell me what it does",
    "{test} fails on CI, fix it",
    "add type hints to {path}",
    "grep for TODOs around {path} and triage them",
    "why does {test} take so long?",
    "tidy up {path}; keep behaviour the same",
)


def _code(rng: random.Random, path: str, lines: int) -> str:
    """Plausible Python source for `path`: numbered lines, no planted strings."""
    out = [f"# {path}", "from __future__ import annotations", ""]
    for n in range(lines):
        a, b = rng.sample(_WORDS, 2)
        style = n % 4
        if style == 0:
            out.append(f"def {a}_{b}({a}: int, {b}: int) -> int:")
        elif style == 1:
            out.append(f'    """Return the {a} of the {b}."""')
        elif style == 2:
            out.append(f"    {a} = {b} * {rng.randint(2, 99)} + {rng.randint(1, 9)}")
        else:
            out.append(f"    return {a} // {rng.randint(2, 9)}")
    return "\n".join(out)


def _tests(rng: random.Random, target: str, failures: int) -> str:
    passed = rng.randint(20, 140)
    lines = [f"$ pytest {target} -q"]
    lines += ["." * rng.randint(20, 60) for _ in range(rng.randint(2, 5))]
    for k in range(failures):
        a, b = rng.sample(_WORDS, 2)
        lines += [
            f"FAILED {target}::test_{a}_{b} - AssertionError: "
            f"assert {rng.randint(100, 999)} == {rng.randint(100, 999)}",
            f"  File {target}, line {rng.randint(10, 400)}, in test_{a}_{b}",
            f"E   {a} mismatch after {b} step {k + 1}",
        ]
    seconds = f"{rng.randint(1, 90)}.{rng.randint(10, 99)}"
    lines.append(f"{failures} failed, {passed} passed in {seconds}s")
    return "\n".join(lines)


def _grep(rng: random.Random, pattern: str) -> str:
    hits = []
    for _ in range(rng.randint(4, 14)):
        path = rng.choice(_MODULES)
        a, b = rng.sample(_WORDS, 2)
        hits.append(f"{path}:{rng.randint(1, 400)}:    # {pattern}: {a} {b} cleanup")
    return "\n".join(hits)


@attrs.define
class _Calls:
    """Numbers the tool calls of a planned session."""

    prefix: str
    n: int = 0

    def __call__(self, name: str, **arguments: Any) -> ToolCallPart:
        self.n += 1
        return ToolCallPart(
            id=f"{self.prefix}-{self.n}", name=name, arguments=arguments
        )


def _coding_run(
    rng: random.Random, t: int, calls: _Calls, plant: Probe | None, seen: list[str]
) -> PlannedRun:
    """One coding run: a task, 2-6 tool rounds, a closing reply."""
    path = rng.choice(_SOURCES)
    test = rng.choice(_TESTS)
    task = rng.choice(_CODING_TASKS).format(path=path, test=test)
    replies: list[Message] = []
    results: dict[str, str] = {}
    closing = f"Done: {path} looked at, {test} checked."
    if plant is not None:
        task, closing = _coding_plant(t, task, closing)
    rounds = rng.randint(2, 6)
    for r in range(rounds):
        choice = rng.random()
        if seen and choice < 0.2:  # read a file again, as agents do
            again = rng.choice(seen)
            call = calls("read_file", path=again)
            results[call.id] = _code(random.Random(again), again, 40)
        elif choice < 0.5:
            call = calls("read_file", path=path)
            results[call.id] = _code(random.Random(path), path, rng.randint(30, 80))
            seen.append(path)
        elif choice < 0.75:
            call = calls("run_tests", target=test)
            results[call.id] = _tests(rng, test, rng.randint(0, 3))
        elif choice < 0.9:
            call = calls("edit_file", path=path, change=f"simplify step {r + 1}")
            if rng.random() < 0.2:
                results[call.id] = (
                    f"error: patch does not apply to {path} at line "
                    f"{rng.randint(5, 300)} (context mismatch)"
                )
            else:
                results[call.id] = f"ok: {rng.randint(1, 20)} lines changed in {path}"
        else:
            pattern = rng.choice(("TODO", "FIXME", "XXX"))
            call = calls("grep", pattern=pattern)
            results[call.id] = _grep(rng, pattern)
        replies.append(Message.assistant("", tool_calls=[call]))
    if plant is not None and t in (4, 6, 14):
        replies, results = _coding_tool_plant(t, calls, replies, results)
    replies.append(Message.assistant(closing))
    return PlannedRun(task, tuple(replies), results)


def _coding_plant(t: int, task: str, closing: str) -> tuple[str, str]:
    """The run's task and closing reply, with its probe planted."""
    if t == 0:
        task = (
            "Some context before we start on the ledger: CI builds on the "
            "ci-runner:7.3.1-bookworm image, so match its Python. " + task
        )
    elif t == 2:
        task = (
            "About the TOML parser: we decided to vendor tomlkit instead of "
            "pinning it, because upstream dropped Python 3.8 and we still "
            "ship to it. " + task
        )
    elif t == 9:
        closing += (
            " The rounding fix is in; after it we still have to backfill the "
            "currency column for old invoices."
        )
    elif t == 18:
        closing += (
            " I put the new exporter behind a feature flag rather than a "
            "migration guard: rollbacks must not need a deploy."
        )
    elif t == 24:
        closing += (
            " Before the release is tagged we must rerun the contract tests "
            "against staging."
        )
    return task, closing


def _coding_tool_plant(
    t: int, calls: _Calls, replies: list[Message], results: dict[str, str]
) -> tuple[list[Message], dict[str, str]]:
    """Plant a probe in a tool result (and the reply that reads it)."""
    if t == 4:
        call = calls(
            "edit_file", path="src/ledger/rounding.py", change="use ROUND_HALF_EVEN"
        )
        results[call.id] = (
            "ok: 6 lines changed in src/ledger/rounding.py "
            "(quantize now uses ROUND_HALF_EVEN; tests/test_rounding.py passes)"
        )
    elif t == 6:
        call = calls("run_tests", target="tests/test_export.py", repeat=50)
        results[call.id] = (
            "$ pytest tests/test_export.py --count 50\n"
            "1 failed, 49 passed: it fails only with TZ=Pacific/Chatham set"
        )
    else:
        call = calls("write_file", path="migrations/0042_add_currency.py")
        results[call.id] = "ok: created migrations/0042_add_currency.py"
        replies.append(Message.assistant("", tool_calls=[call]))
        call = calls("run_command", cmd="alembic current")
        results[call.id] = "0041_invoice_index (head is 0042_add_currency: not applied)"
    replies.append(Message.assistant("", tool_calls=[call]))
    return replies, results


def _plan_coding(runs: int) -> Planned:
    rng = random.Random(21)
    calls = _Calls("call")
    planted = dict(_CODING_PROBES)
    seen: list[str] = []
    planned = tuple(
        _coding_run(rng, t, calls, planted.get(t), seen) for t in range(runs)
    )
    return Planned(
        "corpus-coding",
        "You are a coding agent working in the ledger repository.",
        planned,
        tuple(p for t, p in _CODING_PROBES if t < runs),
    )


# -- the chat session -------------------------------------------------------------

_CHAT_PROBES: Final = (
    (
        0,
        Probe(
            kind="fact",
            question="What is the launch budget?",
            expect=("EUR 184,000",),
            session="corpus-chat",
        ),
    ),
    (
        3,
        Probe(
            kind="decision",
            question="Which region did we pick for the pilot, and why?",
            expect=("Lisbon", "Portuguese-speaking support"),
            session="corpus-chat",
        ),
    ),
    (
        6,
        Probe(
            kind="artifact",
            question="Which version of the pricing memo is current, and its state?",
            expect=("pricing memo v4", "awaiting legal review"),
            session="corpus-chat",
        ),
    ),
    (
        10,
        Probe(
            kind="next_step",
            question="What is the next step for the partner programme?",
            expect=("call Halvorsen Logistics",),
            session="corpus-chat",
        ),
    ),
    (
        15,
        Probe(
            kind="decision",
            question="Which plan tier did we drop, and why?",
            expect=("Starter tier", "support cost per seat"),
            session="corpus-chat",
        ),
    ),
    (
        20,
        Probe(
            kind="fact",
            question="Who signs off the contract?",
            expect=("Ingrid Solberg",),
            session="corpus-chat",
        ),
    ),
    (
        26,
        Probe(
            kind="artifact",
            question="What state is the onboarding checklist in?",
            expect=("onboarding checklist", "11 of 14 items"),
            session="corpus-chat",
        ),
    ),
    (
        30,
        Probe(
            kind="next_step",
            question="What do we do first next Monday?",
            expect=("dry-run the webinar",),
            session="corpus-chat",
        ),
    ),
)

_CHAT_PLANTS: Final = {
    0: ("Our launch budget is EUR 184,000 for the whole quarter.", ""),
    3: (
        "",
        "Agreed: the pilot runs in Lisbon, because the team there already "
        "covers Portuguese-speaking support.",
    ),
    6: (
        "",
        "I have updated the pricing memo v4; it is now awaiting legal review.",
    ),
    10: (
        "",
        "For the partner programme, the next step is to call Halvorsen "
        "Logistics about the co-marketing slot.",
    ),
    15: (
        "We drop the Starter tier: its support cost per seat is higher than its price.",
        "",
    ),
    20: ("The contract is signed off by Ingrid Solberg, nobody else.", ""),
    26: (
        "",
        "Status of the onboarding checklist: 11 of 14 items done, the rest "
        "wait on the design team.",
    ),
    30: ("", "First thing next Monday: dry-run the webinar with the sales team."),
}

_TOPICS: Final = (
    "the marketing calendar",
    "hiring for the support desk",
    "the quarterly roadmap",
    "the website copy",
    "customer interviews",
    "the churn dashboard",
    "the events budget",
    "the newsletter",
)
_CHAT_ASKS: Final = (
    "Can you draft a few thoughts on {topic}?",
    "What are the risks around {topic}?",
    "Summarise where we are with {topic}.",
    "Give me three options for {topic}.",
    "What would you change about {topic}?",
)
_SENTENCES: Final = (
    "One option is to start small and widen the scope once the first results come in.",
    "The main risk is timing: several teams depend on the same people this month.",
    "We could reuse most of last year's material with a fresh angle.",
    "It would help to agree on one owner so that decisions do not stall.",
    "The numbers so far are encouraging but the sample is still small.",
    "A short written brief would keep everyone aligned before the kickoff.",
    "Feedback from customers points to onboarding as the weakest step.",
    "We should keep an eye on the workload of the support desk.",
    "A weekly check-in of fifteen minutes is usually enough at this stage.",
    "Nothing here is blocked; the open questions are about priorities.",
)


def _chat_run(rng: random.Random, t: int) -> PlannedRun:
    topic = rng.choice(_TOPICS)
    ask = rng.choice(_CHAT_ASKS).format(topic=topic)
    said, answered = _CHAT_PLANTS.get(t, ("", ""))
    if said:
        ask = f"{said} {ask}"
    body = " ".join(rng.choice(_SENTENCES) for _ in range(rng.randint(12, 30)))
    reply = f"On {topic}: {body}"
    if answered:
        reply = f"{answered} {reply}"
    return PlannedRun(ask, (Message.assistant(reply),), {})


def _plan_chat(runs: int) -> Planned:
    rng = random.Random(22)
    return Planned(
        "corpus-chat",
        "You are a planning assistant for a small product team.",
        tuple(_chat_run(rng, t) for t in range(runs)),
        tuple(p for t, p in _CHAT_PROBES if t < runs),
    )


# -- the corpus -------------------------------------------------------------------


def plan_corpus(*, coding_runs: int = 40, chat_runs: int = 60) -> tuple[Planned, ...]:
    """Plan the shipped corpus (deterministic): the coding session, the chat.

    Raises:
        AssertionError: a probe is present in the filler, not only where
            it is planted (the generator's own check).
    """
    planned = (_plan_coding(coding_runs), _plan_chat(chat_runs))
    for plan in planned:
        _check_filler(plan)
    return planned


def _check_filler(plan: Planned) -> None:
    """Each probe's strings occur only where they are planted."""
    plants = {
        "corpus-coding": {t for t, _ in _CODING_PROBES},
        "corpus-chat": {t for t, _ in _CHAT_PROBES},
    }[plan.session_id]
    filler = "\n".join(
        _run_text(run) for t, run in enumerate(plan.runs) if t not in plants
    )
    for probe in plan.probes:
        assert not present(probe, filler), (plan.session_id, probe.expect)


def _run_text(run: PlannedRun) -> str:
    return "\n".join([run.task, context_text(run.replies), *run.results.values()])


def corpus_probes() -> tuple[Probe, ...]:
    """The shipped corpus's probes (both sessions)."""
    return tuple(p for plan in plan_corpus() for p in plan.probes)


def recorded_tools(
    results: Callable[[], Mapping[str, str]], names: Sequence[str]
) -> list[Tool]:
    """Tools named `names` that answer each call with its recorded result.

    `results` returns the results by call id (read when a call runs). A call
    with no recorded result gets an error result.
    """

    def answer(**_arguments: Any) -> str:
        call = current_tool_call()
        assert call is not None
        return results()[call.id]

    return [
        Tool(
            name=name,
            description=f"{name} (recorded)",
            parameters={"type": "object"},
            fn=answer,
        )
        for name in names
    ]


def _tool_names(plan: Planned) -> list[str]:
    names = {
        c.name for run in plan.runs for reply in run.replies for c in reply.tool_calls
    }
    return sorted(names)


async def store_corpus(store: SessionStore) -> tuple[Session, ...]:
    """Run the shipped corpus through a scripted `Agent` into `store`.

    Nothing is compacted (the window is 1,000,000 tokens, no message-count
    line): the stored sessions are the whole record, ready to be replayed
    under any strategy. Returns the stored sessions.
    """
    sessions: list[Session] = []
    for plan in plan_corpus():
        current: dict[str, str] = {}

        def results(current: dict[str, str] = current) -> dict[str, str]:
            return current

        script = [reply for run in plan.runs for reply in run.replies]
        agent = Agent(
            model=ScriptedModel(script),
            tools=recorded_tools(results, _tool_names(plan)),
            system_prompt=plan.system,
            context=ContextManager(
                TruncatingCompactor(), context_window=RECORD_WINDOW, max_messages=0
            ),
            max_turns=50,
            session=Session(plan.session_id, store=store),
        )
        for run in plan.runs:
            current.clear()
            current.update(run.results)
            result = await agent.run(run.task)
            result.raise_for_failure()
        sessions.append(agent.session)
    return tuple(sessions)
