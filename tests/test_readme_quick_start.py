"""The README's quick start runs as written and prints what the README shows."""

from __future__ import annotations

import contextlib
import io
import re

from tests.helpers import REPO_ROOT


def test_the_quick_start_prints_what_the_readme_shows() -> None:
    text = (REPO_ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1]
    found = re.search(r"```python\n(.*?)```\n\n```text\n(.*?)```", section, re.S)
    assert found is not None, "the quick start's code and its output"
    code, shown = found.groups()
    printed = io.StringIO()

    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md (quick start)", "exec"), {})

    assert printed.getvalue() == shown
