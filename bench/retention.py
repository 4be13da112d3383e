"""Fact retention of each compaction strategy over one long, tool-heavy session.

Generates a session from ``--seed``: nine facts planted in the first three
turns (three numbers, three names, three decisions, one of each per turn:
"the deploy code is 7431", "our DBA is Priya Raman", "we decided to use
PostgreSQL 16 because ..."), then filler turns: most call tools (one or two
rounds, sometimes parallel calls) whose results are log text of
``--tool-bytes`` (1-4 KB), the rest are chit-chat. No filler text contains a
fact's key value as a whole word, so a key found in a context comes from its
planting.

Each strategy then replays the session the way the driver would: turns are
added in chunks of ``--chunk``, and whenever the context is over the
threshold line, ``ContextManager(compactor, context_window=W, threshold=80)``
(the default counter) runs ``ContextManager.compact`` passes (reason
THRESHOLD_EXCEEDED), at most ``--max-passes`` of them, until the context is
under the line; anything but a `CompactionResult` ends the crossing with the
context kept as it was. As in the driver, only a `CompactorFailed` counts
towards the circuit breaker, and a context left over the window W is where a real run
would fail (``context_exceeded``): the table shows that turn, and the replay
goes on growing the session so that retention can still be measured. The
summarising strategies write a first summary, then update it. The strategies:

- ``none``: the baseline, no compaction (the context is the whole session);
- ``truncating``: `TruncatingCompactor` (defaults: first message + last 4);
- ``summarizing``: `SummarizingCompactor` (``--keep-turns`` raw turns,
  ``--summary-tokens``, the summary window = W);
- ``layered``: `LayeredCompactor` (defaults, ``--summary-tokens``, the
  summary window = W);
- ``digest``: `ToolResultDigest` (results over ``--digest-chars`` of all but
  the newest turn become one-line digests; it drops nothing, so it may not
  fit).

Reported per strategy, in this process: tokens before (the whole session,
uncompacted) and after (the final context), their ratio, the first turn
over W, the passes and their verdicts, summary-model calls, the wall time of
the replay (best of ``--repeats``, interleaved) and its ratio to
``truncating``'s, and the fraction of planted facts still answerable by
string presence of their key value in the final context; then the same per
fact.

The summary model is `ExtractiveSummaryModel` (deterministic, no language
model: SIMULATED in the output). It keeps the newest lines that hold a
number or a name, and log lines all do, so under SIMULATED the summarising
strategies' retention measures that double, not a model. With ``--model
local`` it is Gemma 3 270M on a local llama.cpp server (`LlamaServer`,
`OpenAIModel`), and each planted question is also asked of it over each
final context: one user message, the context rendered as a transcript
(llama.cpp's gemma template drops system and tool messages, which would
hide a system-role summary), then the question; ``--answer-tokens`` reply
tokens, temperature 0. The fraction of answers that contain the key value
is reported; a context over the server's ``n_ctx`` cannot be asked (n/a).
The model reads ~100 prompt tokens/s on 2 free cores (much less when the
machine is busy), so ``--model local`` defaults to a 20-turn session with
300-1100-byte tool results in a 2,048-token window (W = n_ctx).

    python bench/retention.py                     # simulated, a few seconds
    python bench/retention.py --model local       # real model, minutes
    python bench/retention.py --turns 600 --window 32768 --seed 7
    python bench/retention.py --strategies truncating,summarizing

Progress goes to stderr (with ``--model local``: each summary call, the
final summaries and every answer); the tables (markdown) to stdout.
"""

from __future__ import annotations

import argparse
import functools
import random
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import attrs

from turnfsm.context import (
    CompactionRequest,
    ContextCompactor,
    ContextManager,
    LayeredCompactor,
    SummarizingCompactor,
    ToolResultDigest,
    TruncatingCompactor,
)
from turnfsm.context._transcript import is_summary, render_transcript
from turnfsm.core import (
    CompactionCircuitOpened,
    CompactionNoop,
    CompactionOverflowed,
    CompactionResult,
    CompactorFailed,
    CompactReason,
    PassEvent,
)
from turnfsm.errors import ProviderError
from turnfsm.messages import Message, ToolCallPart
from turnfsm.providers import ModelClient, ModelRequest, ModelResponse
from turnfsm.testing import ExtractiveSummaryModel
from turnfsm.tokens import default_counter

STRATEGIES = ("none", "truncating", "summarizing", "layered", "digest")
SESSION_ID = "bench-retention"

# Per-mode defaults: the local model reads ~100 prompt tokens/s, so its
# session is smaller, its window is its n_ctx and its tool results fit it.
PRESETS: dict[str, dict[str, Any]] = {
    "simulated": {
        "turns": 300,
        "window": 16_384,
        "tool_bytes": "1000-4000",
        "chunk": 5,
        "keep_turns": 2,
        "summary_tokens": 600,
        "digest_chars": 2000,
    },
    "local": {
        "turns": 20,
        "window": 2_048,
        "tool_bytes": "300-1100",
        "chunk": 2,
        "keep_turns": 1,
        "summary_tokens": 150,
        "digest_chars": 400,
    },
}


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- the session ---------------------------------------------------------------


@attrs.frozen
class Fact:
    kind: str  # number | name | decision
    statement: str  # the clause planted in a user message
    question: str
    key: str  # the value an answer must contain


FIRST = ("Priya", "Tomasz", "Amara", "Kenji", "Lucia", "Oskar", "Nadia", "Rafael")
LAST = ("Raman", "Kowalski", "Okafor", "Watanabe", "Ferreira", "Lindqvist", "Haddad")
DATABASES = ("PostgreSQL 16", "MySQL 8.4", "CockroachDB 23")
DB_REASONS = (
    "we need logical replication for the reporting replica",
    "the team already runs it in two other services",
    "it handles the multi-region writes we expect",
)
DEPLOYERS = ("Argo CD", "Flux 2", "Spinnaker")
DEPLOY_REASONS = (
    "it keeps the cluster state in git",
    "it has the progressive rollouts we want",
    "the platform team supports it",
)
CACHES = ("Redis 7", "Valkey 8", "Memcached 1.6")
CACHE_REASONS = (
    "sessions must survive a node restart",
    "its licence suits us",
    "it is the cheapest option for plain key lookups",
)

SERVICES = ("billing", "checkout", "search", "auth", "ledger", "notifier")
LEVELS = ("INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR")
EVENTS = (
    "processed batch {a} in {b} ms",
    "retrying upstream call to {svc}-api (attempt {c}/5)",
    "cache miss for key user:{a}",
    "gc pause {b} ms, heap {a} KiB",
    "pool size={c} idle={d} waiting={e}",
    "request id={a} status={code} latency={b}ms",
    "flushed {c} metrics to the collector",
    "health check passed in {b} ms",
)
CHATTER = (
    ("thanks, that helps", "Glad to help. Anything else?"),
    ("quick break, back in five", "Sure, I will wait."),
    ("how is it going so far?", "Steady progress; nothing is blocked."),
    ("nice work on that last one", "Thank you!"),
    ("ok, what next?", "I suggest we look at the next failing job."),
)
TASKS = (
    "check the {svc} logs for errors",
    "why is {svc} slow this morning?",
    "look at the failing {svc} job",
    "grep the {svc} logs for timeouts",
    "read the {svc} worker log and tell me what you see",
)


def log_text(rng: random.Random, service: str, size: int) -> str:
    """Return whole log lines of `service`, at most `size` bytes (one at least)."""
    lines: list[str] = []
    used = 0
    while used < size:
        event = rng.choice(EVENTS).format(
            a=rng.randint(1000, 999_999),
            b=rng.randint(1, 900),
            c=rng.randint(1, 5),
            d=rng.randint(0, 40),
            e=rng.randint(0, 9),
            code=rng.choice((200, 200, 200, 404, 500, 503)),
            svc=rng.choice(SERVICES),
        )
        stamp = (
            f"2024-05-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:"
            f"{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z"
        )
        line = f"{stamp} {rng.choice(LEVELS)} {service}[{rng.randint(100, 9999)}]: "
        line += event
        if lines and used + len(line) + 1 > size:  # whole lines only
            break
        lines.append(line)
        used += len(line) + 1
    return "\n".join(lines)


def tool_call(rng: random.Random, call_id: str, service: str) -> ToolCallPart:
    name = rng.choice(("run_command", "read_file", "search"))
    if name == "run_command":
        arguments = {"cmd": f"kubectl logs deploy/{service} --tail=200"}
    elif name == "read_file":
        arguments = {"path": f"logs/{service}/worker-{rng.randint(1, 9)}.log"}
    else:
        arguments = {"pattern": rng.choice(("timeout", "retry", "status=5"))}
    return ToolCallPart(id=call_id, name=name, arguments=arguments)


def filler_turn(rng: random.Random, t: int, sizes: tuple[int, int]) -> list[Message]:
    """One filler turn: chit-chat, or a task with 1-2 tool rounds."""
    if rng.random() < 0.3:
        ask, answer = rng.choice(CHATTER)
        return [Message.user(ask, id=f"u{t}"), Message.assistant(answer, id=f"f{t}")]
    service = rng.choice(SERVICES)
    out = [Message.user(rng.choice(TASKS).format(svc=service), id=f"u{t}")]
    for r in range(rng.randint(1, 2)):
        calls = [
            tool_call(rng, f"c{t}-{r}-{k}", service)
            for k in range(1 if rng.random() < 0.8 else 2)  # sometimes parallel
        ]
        out.append(Message.assistant("", tool_calls=calls, id=f"a{t}-{r}"))
        out.extend(
            Message.tool_result(
                c.id, log_text(rng, service, rng.randint(*sizes)), id=f"r{c.id}"
            )
            for c in calls
        )
    summary = (
        f"The {service} logs show {rng.randint(2, 60)} retries and "
        f"{rng.randint(0, 9)} errors; nothing critical."
    )
    out.append(Message.assistant(summary, id=f"f{t}"))
    return out


def text_of(messages: Sequence[Message]) -> str:
    """Every string a model could read in `messages`: texts, calls, results."""
    out: list[str] = []
    for m in messages:
        out.append(m.text)
        out.extend(c.arguments_json() for c in m.tool_calls)
        out.extend(r.content for r in m.tool_results)
    return "\n".join(out)


def occurs(key: str, text: str) -> bool:
    """Whether `key` occurs in `text` as a whole word (any case).

    Whole words: a deploy code 7431 is not found in a log's batch 174312.
    """
    pattern = rf"(?<![\w-]){re.escape(key)}(?![\w-])"
    return re.search(pattern, text, re.IGNORECASE) is not None


def pick(make: Callable[[], str], taken: str) -> str:
    """Draw values with `make` until one does not occur in `taken`."""
    for _ in range(1000):
        value = make()
        if not occurs(value, taken):
            return value
    raise RuntimeError("could not draw a fact value absent from the filler")


NUMBERS = (  # statement, question, lowest, highest, prefix
    ("the deploy code is {}", "What is the deploy code?", 1000, 9999, ""),
    (
        "the staging database listens on port {}",
        "Which port does the staging database listen on?",
        20000,
        39999,
        "",
    ),
    (
        "the incident ticket for last week's outage is {}",
        "What is the incident ticket of last week's outage?",
        10000,
        99999,
        "INC-",
    ),
)
ROLES = (  # statement, question
    ("our DBA is {}", "Who is our DBA?"),
    ("the on-call engineer this week is {}", "Who is on call this week?"),
    ("the release manager is {}", "Who is the release manager?"),
)
DECISIONS = (  # statement, question, choices, reasons
    (
        "we decided to use {} because {}",
        "Which database did we decide to use?",
        DATABASES,
        DB_REASONS,
    ),
    (
        "we decided to deploy with {} because {}",
        "Which deployment tool did we decide on?",
        DEPLOYERS,
        DEPLOY_REASONS,
    ),
    (
        "we decided to keep sessions in {} because {}",
        "Where did we decide to keep sessions?",
        CACHES,
        CACHE_REASONS,
    ),
)


def numbered(rng: random.Random, prefix: str, low: int, high: int) -> str:
    return f"{prefix}{rng.randint(low, high)}"


def plant(rng: random.Random, filler: str) -> list[Fact]:
    """Draw the nine facts, one number, name and decision per planting turn.

    No key value occurs in `filler` or in another fact.
    """
    names = [f"{a} {b}" for a in FIRST for b in LAST]
    rng.shuffle(names)
    taken = [filler]
    facts: list[Fact] = []

    def add(kind: str, statement: str, question: str, make: Callable[[], str]) -> str:
        key = pick(make, "\n".join(taken))
        taken.append(key)
        facts.append(Fact(kind, statement.format(key), question, key))
        return key

    for number, role, decision in zip(NUMBERS, ROLES, DECISIONS, strict=True):
        statement, question, low, high, prefix = number
        draw = functools.partial(numbered, rng, prefix, low, high)
        add("number", statement, question, draw)
        add("name", role[0], role[1], names.pop)
        statement, question, choices, reasons = decision
        because = statement.replace("because {}", f"because {rng.choice(reasons)}")
        add("decision", because, question, functools.partial(rng.choice, choices))
    return facts


PLANTING = (
    "Kickoff for the {svc} migration. For the record: {a}, {b}, and {c}.",
    "Two more things to remember: {a} and {b}. Also, {c}.",
    "Last bits of context before we start: {a}; {b}; and {c}.",
)


def build_session(
    seed: int, turns: int, sizes: tuple[int, int]
) -> tuple[list[list[Message]], list[Fact]]:
    """Return the session as a list of turns (lists of messages), and its facts."""
    rng = random.Random(seed)
    filler = [filler_turn(rng, t, sizes) for t in range(len(PLANTING), turns)]
    facts = plant(rng, "\n".join(text_of(turn) for turn in filler))
    planted: list[list[Message]] = []
    for t, template in enumerate(PLANTING):
        a, b, c = facts[3 * t : 3 * t + 3]
        text = template.format(
            svc=rng.choice(SERVICES), a=a.statement, b=b.statement, c=c.statement
        )
        planted.append(
            [
                Message.user(text, id=f"u{t}"),
                Message.assistant("Noted. I will keep that in mind.", id=f"f{t}"),
            ]
        )
    return planted + filler, facts


# -- the replay ---------------------------------------------------------------


class CountingModel:
    """Wraps the summary model: counts its calls and their seconds."""

    def __init__(self, model: ModelClient, *, verbose: bool) -> None:
        self.model = model
        self.verbose = verbose
        self.calls = 0
        self.seconds = 0.0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        start = time.perf_counter()
        response = await self.model.complete(request)
        spent = time.perf_counter() - start
        self.calls += 1
        self.seconds += spent
        if self.verbose:
            usage = response.usage
            sizes = (
                f"{usage.input_tokens} in, {usage.output_tokens} out" if usage else ""
            )
            log(f"    summary call {self.calls}: {spent:5.1f} s ({sizes})")
        return response


@attrs.define
class Result:
    strategy: str
    before: int = 0
    after: int = 0
    events: int = 0  # times the context was over the line
    overflow_turn: int | None = None  # first turn whose context is over W
    failures: int = 0  # consecutive CompactorFailed: the breaker's count
    passes: int = 0
    verdicts: dict[str, int] = attrs.field(factory=dict)
    summary_calls: int = 0
    summary_seconds: float = 0.0
    seconds: float = 0.0
    context: tuple[Message, ...] = ()
    facts: tuple[Fact, ...] = ()
    present: list[bool] = attrs.field(factory=list)
    answers: list[str] | None = None  # the local model's, when it was asked
    unasked: str = ""  # why it could not be asked
    qa_seconds: float = 0.0

    @property
    def answered(self) -> list[bool]:
        """Per fact: the local model's answer contains its key value."""
        if self.answers is None:
            return []
        return [occurs(f.key, a) for f, a in zip(self.facts, self.answers, strict=True)]


def make_compactor(
    strategy: str, model: ModelClient, args: argparse.Namespace
) -> ContextCompactor | None:
    if strategy == "none":
        return None
    if strategy == "truncating":
        return TruncatingCompactor()
    if strategy == "summarizing":
        return SummarizingCompactor(
            model=model,
            keep_recent_turns=args.keep_turns,
            max_summary_tokens=args.summary_tokens,
            summary_window=args.window,
        )
    if strategy == "layered":
        return LayeredCompactor(
            model=model,
            max_summary_tokens=args.summary_tokens,
            summary_window=args.window,
        )
    if strategy == "digest":
        return ToolResultDigest(min_chars=args.digest_chars)
    raise ValueError(strategy)


VERDICTS = (
    (CompactionResult, "C"),
    (CompactionNoop, "N"),
    (CompactionOverflowed, "O"),
    (CompactorFailed, "E"),
    (CompactionCircuitOpened, "B"),
)


async def replay(
    strategy: str,
    session: list[list[Message]],
    facts: Sequence[Fact],
    summary_model: ModelClient,
    args: argparse.Namespace,
) -> Result:
    """Grow the session chunk by chunk, compacting like the driver would."""
    counting = CountingModel(summary_model, verbose=args.model == "local")
    compactor = make_compactor(strategy, counting, args)
    counter = default_counter()
    manager = (
        ContextManager(
            compactor, context_window=args.window, threshold=80, counter=counter
        )
        if compactor is not None
        else None
    )
    out = Result(strategy)
    context: list[Message] = []
    summaries: dict[str, str] = {}
    start = time.perf_counter()
    for first in range(0, len(session), args.chunk):
        chunk = session[first : first + args.chunk]
        context.extend(m for turn in chunk for m in turn)
        turn = first + len(chunk) - 1
        size = counter.count(context)
        if manager is not None and size > manager.threshold_line:
            out.events += 1
            context, size = await crossing(
                manager, context, size, turn, out, args, summaries
            )
            summaries.update({m.id: m.text for m in context if is_summary(m)})
        if size > args.window and out.overflow_turn is None:
            out.overflow_turn = turn  # a real run would fail here
        if args.model == "local":
            log(f"  {strategy}: turn {turn + 1}/{len(session)}: {size} tokens")
    out.seconds = time.perf_counter() - start
    out.summary_calls = counting.calls
    out.summary_seconds = counting.seconds
    out.before = counter.count([m for turn in session for m in turn])
    out.after = counter.count(context)
    out.context = tuple(context)
    found = text_of(context)
    out.facts = tuple(facts)
    out.present = [occurs(f.key, found) for f in facts]
    return out


async def crossing(
    manager: ContextManager,
    context: list[Message],
    size: int,
    turn: int,
    out: Result,
    args: argparse.Namespace,
    summaries: dict[str, str],
) -> tuple[list[Message], int]:
    """Compact `context` (over the line) in passes, as the driver would.

    At most `args.max_passes` passes, until it is under the threshold line;
    anything but a `CompactionResult` ends the crossing (the driver keeps the
    messages). Only a `CompactorFailed` counts towards the breaker.
    """
    for _ in range(args.max_passes):
        out.passes += 1
        event = await manager.compact(
            CompactionRequest(
                messages=context,
                reason=CompactReason.THRESHOLD_EXCEEDED,
                turn=turn,
                tokens_before=size,
                failures=out.failures,
                session_id=SESSION_ID,
                summaries=summaries,
            )
        )
        tag = next(t for kind, t in VERDICTS if isinstance(event, kind))
        out.verdicts[tag] = out.verdicts.get(tag, 0) + 1
        if not isinstance(event, CompactionResult):
            if isinstance(event, CompactorFailed):
                out.failures += 1
            if args.model == "local" and not isinstance(event, CompactionNoop):
                log(f"    turn {turn + 1}: {describe(event)}")
            break
        out.failures = 0
        context, size = list(event.messages), event.after
        if size <= manager.threshold_line:
            break
    return context, size


def describe(event: PassEvent) -> str:
    """One line for a pass that did not compact (the local model's log)."""
    match event:
        case CompactionOverflowed(used=used, limit=limit):
            return f"CompactionOverflowed: {used} tokens of a {limit}-token window"
        case CompactorFailed(error=error):
            return f"CompactorFailed: {error.message}"
        case CompactionCircuitOpened(failures=failures):
            return f"CompactionCircuitOpened after {failures} failures"
    return type(event).__name__


def show_summary(result: Result) -> None:
    """Log the final context's summary (what the real model wrote), clipped."""
    for m in result.context:
        if is_summary(m):
            body = " ".join(m.text.split())
            log(f"  {result.strategy}: final summary: {body[:600]}")


# -- asking the local model ------------------------------------------------------

# The context as one transcript (llama.cpp's gemma template drops system and
# tool messages), then the question: every question over one context shares
# the transcript as a prefix, which the server keeps evaluated.
QA_TAIL = (
    "\n\n---\nThe text above is a conversation. {question} Reply with only the answer."
)


async def ask_all(
    model: ModelClient, result: Result, facts: Sequence[Fact], tokens: int
) -> None:
    """Ask every planted question over `result.context`; record the answers."""
    transcript = render_transcript(result.context)
    answers: list[str] = []
    start = time.perf_counter()
    for fact in facts:  # one context, then each question: the prefix is cached
        prompt = transcript + QA_TAIL.format(question=fact.question)
        request = ModelRequest(
            messages=[Message.user(prompt)], max_tokens=tokens, temperature=0
        )
        try:
            answer = (await model.complete(request)).message.text
        except ProviderError as exc:
            result.unasked = str(exc).splitlines()[0]
            log(f"  {result.strategy}: cannot ask: {result.unasked[:100]}")
            break
        answers.append(answer)
        log(f"  {result.strategy}: {fact.question!r} -> {answer.strip()[:70]!r}")
    else:
        result.answers = answers
    result.qa_seconds = time.perf_counter() - start


# -- the tables -------------------------------------------------------------------


def fraction(flags: Sequence[bool]) -> str:
    n = sum(flags)
    return f"{n}/{len(flags)} ({n / len(flags):.0%})" if flags else "-"


def unasked(r: Result) -> str:
    overflow = "context_overflow" in r.unasked or "context length" in r.unasked
    return "n/a (over n_ctx)" if overflow else "n/a (failed)"


def verdict_text(verdicts: dict[str, int]) -> str:
    parts = [f"{verdicts[t]}{t}" for _kind, t in VERDICTS if verdicts.get(t)]
    return " ".join(parts) or "-"


def print_tables(
    results: Sequence[Result], facts: Sequence[Fact], args: argparse.Namespace
) -> None:
    base = next((r.seconds for r in results if r.strategy == "truncating"), None)
    local = args.model == "local"
    head = [
        "strategy",
        "tokens before",
        "tokens after",
        "after/before",
        "over W at turn",
        "passes (crossings)",
        "verdicts",
        "summary calls",
        "wall s",
        "x truncating",
        "facts present",
    ]
    if local:
        head += ["answered (local)", "summary s", "Q&A s"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---:" if i else "---" for i in range(len(head))) + "|")
    for r in results:
        ratio = f"{r.seconds / base:,.2f}x" if base else "-"
        row = [
            r.strategy,
            f"{r.before:,}",
            f"{r.after:,}",
            f"{r.after / r.before:.3f}",
            "never" if r.overflow_turn is None else str(r.overflow_turn + 1),
            f"{r.passes} ({r.events})",
            verdict_text(r.verdicts),
            str(r.summary_calls),
            f"{r.seconds:.3f}",
            ratio,
            fraction(r.present),
        ]
        if local:
            row += [
                fraction(r.answered) if r.answers is not None else unasked(r),
                f"{r.summary_seconds:.0f}",
                f"{r.qa_seconds:.0f}",
            ]
        print("| " + " | ".join(row) + " |")
    print()
    print("verdicts: C CompactionResult, N CompactionNoop, O CompactionOverflowed,")
    print("E CompactorFailed, B CompactionCircuitOpened. over W at turn: the first")
    print("turn after which the context (compacted, if it was) was over the window:")
    print("a real run fails there.")
    print()
    marks = "present / answered" if local else "present"
    print(f"per fact ({marks}; + yes, - no, . not asked)")
    print()
    print("| fact | key | " + " | ".join(r.strategy for r in results) + " |")
    print("|---|---|" + "|".join(":---:" for _ in results) + "|")
    for i, f in enumerate(facts):
        cells = []
        for r in results:
            cell = "+" if r.present[i] else "-"
            if local:
                cell += "/" + (("+" if r.answered[i] else "-") if r.answers else ".")
            cells.append(cell)
        print(f"| {f.kind}: {f.question} | {f.key} | " + " | ".join(cells) + " |")


# -- main -------------------------------------------------------------------------


async def measure(args: argparse.Namespace) -> None:
    session, facts = build_session(args.seed, args.turns, args.sizes)
    n_messages = sum(len(t) for t in session)
    server: Any = None
    if args.model == "local":
        from turnfsm.providers import LlamaServer, OpenAIModel

        log(f"starting the local model (n_ctx {args.window}) ...")
        server = LlamaServer(n_ctx=args.window, n_threads=args.threads).start()
        model: Any = OpenAIModel(model="local", base_url=server.base_url, timeout=600)
        label = "REAL local model: Gemma 3 270M on llama.cpp (OpenAIModel)"
    else:
        model = ExtractiveSummaryModel()
        label = "SIMULATED: ExtractiveSummaryModel (deterministic, no language model)"
    repeats = 1 if args.model == "local" else args.repeats
    best: dict[str, Result] = {}
    try:
        for _ in range(repeats):  # interleaved: each strategy sees the same noise
            for strategy in args.strategies:
                log(f"{strategy}: replaying {args.turns} turns ...")
                fresh = model if server is not None else ExtractiveSummaryModel()
                result = await replay(strategy, session, facts, fresh, args)
                log(
                    f"{strategy}: {result.seconds:.2f} s, {result.passes} passes, "
                    f"{result.summary_calls} summary calls"
                )
                if server is not None or args.show_summary:
                    show_summary(result)
                kept = best.get(strategy)
                if kept is None or result.seconds < kept.seconds:
                    best[strategy] = result
        results = [best[s] for s in args.strategies]
        if server is not None:
            for result in results:
                log(f"{result.strategy}: asking {len(facts)} questions ...")
                await ask_all(model, result, facts, args.answer_tokens)
    finally:
        if server is not None:
            await model.close()
            server.stop()
    print(
        f"Fact retention after compaction: {args.turns} turns ({n_messages:,} "
        f"messages, tool results {args.tool_bytes} bytes), seed {args.seed}, "
        f"window {args.window:,} (threshold line {args.window * 80 // 100:,}), "
        f"chunks of {args.chunk} turns, <= {args.max_passes} passes per crossing; "
        f"wall time: best of {repeats}."
    )
    print(
        f"Summary model: {label}; max_summary_tokens {args.summary_tokens}, "
        f"summarizing keeps {args.keep_turns} turn(s), digest over "
        f"{args.digest_chars} chars."
    )
    print(
        f"Facts: {len(facts)} planted in the first {len(PLANTING)} turns; "
        "present = the key value occurs (a whole word) in the final context."
    )
    if server is None:
        print(
            "SIMULATED: the double keeps what the user and the assistant stated "
            "before tool output, as the prompt asks; the summarising rows "
            "measure the double, a real model's depend on the model."
        )
    print()
    print_tables(results, facts, args)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Defaults marked * depend on --model (simulated / local): "
        + "; ".join(
            f"{k} {PRESETS['simulated'][k]} / {PRESETS['local'][k]}"
            for k in PRESETS["simulated"]
        ),
    )
    parser.add_argument(
        "--model",
        choices=("simulated", "local"),
        default="simulated",
        help="summary model: the extractive double, or Gemma 3 270M on llama.cpp",
    )
    parser.add_argument("--seed", type=int, default=1, help="the session's seed")
    parser.add_argument("--turns", type=int, help="turns in the session *")
    parser.add_argument("--window", type=int, help="context window W (local: n_ctx) *")
    parser.add_argument("--tool-bytes", help="tool result sizes, MIN-MAX bytes *")
    parser.add_argument("--chunk", type=int, help="turns added between checks *")
    parser.add_argument("--keep-turns", type=int, help="summarizing: raw turns *")
    parser.add_argument("--summary-tokens", type=int, help="max_summary_tokens *")
    parser.add_argument("--digest-chars", type=int, help="digest: min_chars *")
    parser.add_argument(
        "--max-passes", type=int, default=5, help="passes per threshold crossing"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="replays per strategy (local: 1)"
    )
    parser.add_argument(
        "--answer-tokens", type=int, default=24, help="local: reply tokens per answer"
    )
    parser.add_argument("--threads", type=int, default=2, help="local: n_threads")
    parser.add_argument(
        "--strategies",
        default=",".join(STRATEGIES),
        help=f"comma-separated, of {', '.join(STRATEGIES)}",
    )
    parser.add_argument(
        "--show-summary",
        action="store_true",
        help="log each strategy's final summary to stderr",
    )
    args = parser.parse_args(argv)
    for key, value in PRESETS[args.model].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = set(args.strategies) - set(STRATEGIES)
    if unknown:
        parser.error(f"unknown strategies: {', '.join(sorted(unknown))}")
    low, _, high = args.tool_bytes.partition("-")
    if not (low.isdigit() and high.isdigit() and 0 < int(low) <= int(high)):
        parser.error(f"--tool-bytes: MIN-MAX bytes, not {args.tool_bytes!r}")
    args.sizes = (int(low), int(high))
    if args.turns <= len(PLANTING):
        parser.error(f"--turns must be more than {len(PLANTING)}")
    started = time.perf_counter()
    anyio.run(measure, args)
    print(f"\n(whole run {time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main(sys.argv[1:])
