"""Retention benchmark: what a compacted context still knows, per strategy.

A stored session is replayed under each strategy (the recorded replies and
tool results held fixed) and its final context is checked against probes of
four kinds (`PROBE_KINDS`): a fact to recall, an artifact and its state, the
next step, a decision and its reason. Each probe is present when its
expected strings occur in the context; a judge model, when one is given,
is also asked the probe's question over it. `store_corpus` writes the
shipped corpus (a tool-heavy coding session and a long chat, generated);
`load_probes` reads a user's probe file for their own sessions. The
``turnfsm eval`` command prints `Evaluation.table` and fails under a floor.
"""

from __future__ import annotations

from turnfsm.evals._corpus import CORPUS_SESSIONS, corpus_probes, store_corpus
from turnfsm.evals._evaluate import (
    REREAD_SPAN,
    STRATEGIES,
    EvalProgress,
    Evaluation,
    ProbeResult,
    Progress,
    StrategyResult,
    evaluate,
    reread_rate,
    shipped_strategy,
)
from turnfsm.evals._probes import (
    PROBE_KINDS,
    Probe,
    context_text,
    load_probes,
    present,
)
from turnfsm.evals._replay import ReplayedCall, ReplayedSession, replay_session

__all__ = [
    "CORPUS_SESSIONS",
    "PROBE_KINDS",
    "REREAD_SPAN",
    "STRATEGIES",
    "EvalProgress",
    "Evaluation",
    "Probe",
    "ProbeResult",
    "Progress",
    "ReplayedCall",
    "ReplayedSession",
    "StrategyResult",
    "context_text",
    "corpus_probes",
    "evaluate",
    "load_probes",
    "present",
    "replay_session",
    "reread_rate",
    "shipped_strategy",
    "store_corpus",
]
