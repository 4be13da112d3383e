"""Retention of each compaction strategy: ``turnfsm eval`` on the shipped corpus.

The corpus is two long generated sessions, a tool-heavy coding agent and a
planning chat, with 16 planted probes of four kinds (a fact, an artifact and
its state, the next step, a decision and its reason); each strategy replays
them with the recorded replies and tool results held fixed (see
`turnfsm.evals` and "Evaluate compaction on your sessions" in the docs).
Every argument is passed to ``turnfsm eval``:

    python -m bench.retention                       # every shipped strategy
    python -m bench.retention --window 8192 --strategy layered
    python -m bench.retention --summary-model local --judge local --window 4096
"""

from __future__ import annotations

import sys

from turnfsm.cli import main

if __name__ == "__main__":
    sys.exit(main(["eval", *sys.argv[1:]]))
