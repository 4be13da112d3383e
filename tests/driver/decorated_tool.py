"""A tool made by `@function_tool(in_subprocess=True)`, for `test_tool_subprocess.py`.

The decorator binds the module's name ``double`` to the `Tool`; the child
process finds the function through it. Apart from `isolated_tools.py`
because importing turnfsm makes a child slower to start.
"""

from __future__ import annotations

from turnfsm.driver import function_tool


@function_tool(in_subprocess=True)
def double(n: int) -> int:
    """Double a number in a child process."""
    return n * 2
