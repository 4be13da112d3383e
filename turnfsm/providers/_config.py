"""Settings shared by the SDK clients: where the key comes from, validators."""

from __future__ import annotations

import os
import sys
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any, Final

from turnfsm import _checks
from turnfsm.errors import ConfigError

__all__ = [
    "PLACEHOLDER_KEY",
    "check_ascii_headers",
    "client_check",
    "http_url",
    "model_name",
    "positive_or_none",
    "resolve_api_key",
]

PLACEHOLDER_KEY: Final = "sk-no-key-required"
"""Sent to OpenAI-compatible servers that need no key (the SDKs insist on one)."""


def resolve_api_key(
    explicit: str | None,
    env_var: str,
    *,
    base_url: str | None,
    also_accepted: Sequence[str] = (),
) -> str | None:
    """Return the key to use: `explicit`, else `env_var`'s value.

    Returns None when only an alternative credential in `also_accepted` is
    set (the SDK reads it itself), and the placeholder for a custom
    `base_url` server without a key.

    Raises:
        ConfigError: no key anywhere and no `base_url` (the variable is named),
            or a key no HTTP header can carry: a space, a line break or a
            character past ASCII (a key copied with a newline from a file,
            or with a typographic ellipsis) names where it came from and
            the character, never the key.
    """
    key = explicit or os.environ.get(env_var) or None
    if key is not None:
        _check_key(key, "api_key" if explicit else env_var)
        return key
    if any(os.environ.get(name) for name in also_accepted):
        return None
    if base_url is None:
        raise ConfigError(
            "api_key",
            None,
            f"a key: {env_var} in the environment, or api_key= (or base_url= "
            "for a server that needs no key)",
            missing=True,
        )
    return PLACEHOLDER_KEY


def _check_key(key: str, where: str) -> None:
    """Refuse a `key` that is no header value: printable ASCII, no space at an end.

    Raises:
        ConfigError: naming `where` and the first character at fault.
    """
    last = len(key) - 1
    for i, char in enumerate(key):
        if not " " <= char <= "~" or (char == " " and i in (0, last)):
            raise ConfigError(
                where,
                char,
                "an API key of printable ASCII characters only, without line "
                "breaks or a space at either end (the key, not shown, has this "
                f"one at character {i + 1}); copy it again, or strip what came "
                "with it",
            )


def client_check(async_type: type, sync_type: type) -> _checks.Check:
    """Return a validator: None or an instance of the SDK's `async_type` client.

    The SDK's sync client (`sync_type`), the likeliest mistake, is refused
    naming the async one to pass instead; anything else used to fail at the
    first attribute the model read of it.
    """
    sdk = async_type.__module__.partition(".")[0]
    wanted = f"{sdk}.{async_type.__name__}"
    plain = _checks.instance(
        async_type, f"an {wanted} (the async client)", optional=True
    )

    def validate(inst: object, attr: object, value: object) -> None:
        if isinstance(value, sync_type):
            given = type(value).__name__
            twin = f"Async{given}"
            if not hasattr(sys.modules[sdk], twin):
                twin = async_type.__name__
            raise ConfigError(
                "client",
                value,
                f"an {wanted}, the async client: {given} is the sync one "
                f"(pass {sdk}.{twin}(...) instead)",
            )
        plain(inst, attr, value)

    return validate


def check_ascii_headers(key: object, headers: Mapping[str, object]) -> None:
    """Refuse a client (`key`, `headers`) whose SDK cannot encode its headers.

    The OpenAI SDK sends its headers as ASCII: a key, or a header such as
    an app's name (``X-Title: Caf\u00e9``), holding any other character
    fails every call. Values are never quoted: they may be secrets.

    Raises:
        ConfigError: naming ``client.api_key``, or ``client`` and the header.
    """
    if isinstance(key, str):
        _check_key(key, "client.api_key")
    for name, value in headers.items():
        if not isinstance(value, str):
            continue  # the SDK's placeholders for headers it leaves out
        for i, char in enumerate(value):
            if not " " <= char <= "~":
                raise ConfigError(
                    "client",
                    char,
                    "a client whose headers are printable ASCII, which the "
                    f"SDK can send: its {name} header (not shown) has this "
                    f"character at {i + 1}",
                )


def model_name(provider: str, client: str, example: str) -> Any:
    """Return an attrs validator of a client's ``model``: a name, as its API knows it.

    The command line's spelling, ``provider:MODEL``, is refused for the
    provider's own API (no `base_url`, no `client`), where no model is named
    so: its name would be sent with the prefix, and found by no API. A
    compatible server's names are its own, and are taken as they are.
    """
    check = _checks.string(
        "model", non_empty=True, expected=f"a model name such as {example!r}"
    )
    prefix = f"{provider}:"

    def validate(instance: Any, attribute: Any, value: Any) -> None:
        check(instance, attribute, value)
        if (
            value.startswith(prefix)
            and instance.base_url is None
            and instance.client is None
        ):
            raise ConfigError(
                "model",
                value,
                f"the model's own name, without the command line's {prefix} "
                f"prefix: {client}({value.removeprefix(prefix)!r})",
            )

    return validate


def positive_or_none(name: str) -> Any:
    """Return an attrs validator: None, or seconds > 0 (ConfigError names `name`)."""
    return _checks.seconds(name)


def http_url(example: str) -> Any:
    """Return an attrs validator: None, or an http(s) URL naming a host.

    A URL without its scheme (``localhost:8080/v1``) is taken by the SDKs
    for one whose scheme is ``localhost``: every call then fails to connect,
    naming no server. `example` shows the form a server's URL takes.
    """
    check = _checks.string(non_empty=True, optional=True)

    def validate(inst: object, attr: Any, value: object) -> None:
        check(inst, attr, value)
        if not isinstance(value, str):
            return
        parts = urllib.parse.urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                attr.name, value, f"an http:// or https:// URL, such as {example}"
            )

    return validate
