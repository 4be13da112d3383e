"""Calibrated counts on the real local server, for four kinds of text.

The bundled model's tokenizer is not the one turnfsm's conservative counter
is built for, so the estimate reads it high (or low) by a ratio that depends
on the text. A calibrating manager learns that ratio from the usage the
server reports: after three model calls, its estimate of the next request is
within 5 % of what the server then counts, and no request goes over the
window. The figures printed (estimate and calibrated estimate, each over
the count the server reported, on the fourth call) are what the docs quote.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import anyio
import pytest

from tests.integration._local import require_local_extra, threads
from turnfsm.agent import Agent
from turnfsm.context import ContextManager
from turnfsm.driver import RetryPolicy, Session
from turnfsm.persistence import TurnRecord

require_local_extra()

from turnfsm.providers import LlamaServer, OpenAIModel  # noqa: E402

pytestmark = [pytest.mark.local_model, pytest.mark.slow, pytest.mark.timeout(900)]

N_CTX = 4096
REPLY = 8  # the reply budget: each run is one short model call
CALLS = 3  # model calls the factor is learned from


def _prose(i: int) -> str:
    return " ".join(
        f"On day {i}, the survey team walked along the northern ridge, noted "
        f"that the spring near camp {k} had dried up, and decided to carry "
        "extra water before crossing the valley the next morning."
        for k in range(8)
    )


def _code(i: int) -> str:
    return "\n\n".join(
        f"def load_page_{i}_{k}(store: dict[str, list[int]], key: str) -> int:\n"
        f'    """Return the sum of page {k} under `key`, or -1."""\n'
        f"    rows = store.get(key, [])\n"
        f"    if len(rows) < {k + 2}:\n"
        f"        return -1\n"
        f"    return sum(r * {k + 1} for r in rows[{k}:]) // max(1, len(rows))"
        for k in range(6)
    )


def _json(i: int) -> str:
    rows = [
        {"id": i * 100 + k, "name": f"item-{k}", "price": 3.5 * k, "tags": ["a", "b"]}
        for k in range(14)
    ]
    return json.dumps({"page": i, "rows": rows})


def _non_ascii(i: int) -> str:
    return " ".join(
        f"第{i}日、調査隊は北の尾根を歩き、野営地{k}の泉が枯れていることに気づいた。"
        f"Überprüfung {k}: café, naïve, smørrebrød 🌄🚶"
        for k in range(6)
    )


TEXTS = {"prose": _prose, "code": _code, "json": _json, "non-ascii": _non_ascii}


@pytest.fixture(scope="module")
def server() -> Iterator[LlamaServer]:
    with LlamaServer(n_ctx=N_CTX, n_threads=threads()) as running:
        yield running


def _runs(server: LlamaServer, kind: str, manager: ContextManager) -> Session:
    session = Session()

    async def go() -> None:
        model = OpenAIModel(
            model="local",
            base_url=server.base_url,
            context_window=server.context_window,
        )
        agent = Agent(
            model=model,
            context=manager,
            system_prompt="Answer in one word.",
            max_output_tokens=REPLY,
            max_turns=1,
            retry=RetryPolicy(max_attempts=1),
            model_timeout=120,
        )
        try:
            for i in range(CALLS + 1):
                result = await agent.run(TEXTS[kind](i), session=session)
                assert result.ok, result.error
        finally:
            await model.close()

    anyio.run(go)
    return session


def _turns(session: Session) -> list[TurnRecord]:
    return [t for run in session.runs for t in run.turns]


@pytest.mark.parametrize("kind", list(TEXTS))
def test_the_calibrated_estimate_is_within_5_percent_after_3_calls(
    server: LlamaServer, kind: str
) -> None:
    manager = ContextManager(calibrate=True)
    session = _runs(server, kind, manager)
    turns = _turns(session)
    assert len(turns) == CALLS + 1
    for turn in turns:  # every count says where it came from, and fits
        assert turn.usage is not None
        assert turn.usage.input_tokens > 0
        assert turn.estimate is not None
        assert turn.usage.input_tokens + REPLY <= server.context_window
    ratio = max(t.reported_ratio or 0.0 for t in turns[:CALLS])
    last = turns[CALLS]
    assert last.usage is not None
    assert last.estimate is not None
    reported = last.usage.input_tokens
    before = last.estimate / reported
    calibrated = manager.calibrated(last.estimate, ratio)
    after = calibrated / reported
    print(
        f"{kind}: estimate/reported {before:.3f} -> calibrated/reported "
        f"{after:.3f} (factor {manager.calibration_factor(ratio):.3f})"
    )
    assert abs(after - 1) <= 0.05, (kind, before, after)
