"""turnfsm's bench scripts (``python -m bench.concurrency``; importable by tests)."""
