"""A Griffe extension: show an attrs field's default, not its `attrs.field(...)` call.

Without it the API reference renders ``max_turns: int = attrs.field(default=50,
validator=_checks.integer(low=1))``, private validator names included. With it
the attribute reads ``max_turns: int = 50``; a ``factory=F`` default reads
``F()``; a field without a default shows no value.
"""

from __future__ import annotations

import ast
from typing import Any

import griffe

_FIELD_CALLS = frozenset({"attrs.field", "attr.ib", "attrs.attrib", "field"})


def _default_text(call: ast.Call) -> str | None:
    for keyword in call.keywords:
        if keyword.arg == "default":
            return ast.unparse(keyword.value)
        if keyword.arg == "factory":
            return f"{ast.unparse(keyword.value)}()"
    return None


class AttrsDefaults(griffe.Extension):
    """Replace ``attrs.field(...)`` attribute values by the field's default."""

    def on_attribute_instance(
        self,
        *,
        node: ast.AST | griffe.ObjectNode,
        attr: griffe.Attribute,
        **kwargs: Any,
    ) -> None:
        """Rewrite `attr.value` when it is an attrs field call."""
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.value, ast.Call):
            return
        if ast.unparse(node.value.func) not in _FIELD_CALLS:
            return
        attr.value = _default_text(node.value)
