"""Context windows and prices: the known models' from a catalogue, a server's own.

`known_window` reads the windows of the OpenAI, Anthropic and other
providers' models (and `known_prices` their prices) from the snapshot the
``genai-prices`` package (kept by the pydantic team) ships with: the
bundled data only, never an update fetched at run time, so a lookup makes
no network call. `server_window`
asks a llama.cpp server for its ``n_ctx``. `window_for` is the one place a
run's window is chosen from them.
"""

from __future__ import annotations

import functools
import json
import urllib.error
import urllib.request
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final, final

import attrs

from turnfsm import _checks
from turnfsm.errors import ConfigError, WindowTooLarge
from turnfsm.providers._protocol import ModelClient
from turnfsm.values import Usage

if TYPE_CHECKING:
    from genai_prices.data_snapshot import DataSnapshot

__all__ = [
    "FALLBACK_WINDOW",
    "ModelPrices",
    "known_prices",
    "known_window",
    "server_window",
    "window_for",
]

FALLBACK_WINDOW: Final = 200_000
"""The window, in tokens, of a model whose window is not known, when none is given."""

_WINDOW = _checks.integer(low=1, high=_checks.MAX_TOKENS, optional=True)


@functools.cache
def _catalogue() -> DataSnapshot:
    # The data the package was built with, never the one `UpdatePrices`
    # may have fetched into the package's global snapshot.
    from genai_prices.data import providers
    from genai_prices.data_snapshot import DataSnapshot

    return DataSnapshot(providers=providers, from_auto_update=False)


def known_window(
    model: str, *, provider: str | None = None, api_url: str | None = None
) -> int | None:
    """Return the context window of `model` in tokens, or None if it is not known.

    The figure comes from the catalogue bundled with the ``genai-prices``
    package; nothing is fetched. Dated names find their model
    (``gpt-4o-2024-08-06`` is ``gpt-4o``).

    Args:
        model: the model's name, as sent to the provider (``gpt-4o``,
            ``claude-sonnet-4-5``).
        provider: the provider's id (``openai``, ``anthropic``, ``groq``,
            ...); None: the provider `api_url` names, else the one whose
            models the name looks like.
        api_url: the base URL the model is served from; a URL the
            catalogue does not know (a local server, a proxy) knows no
            window.

    Returns:
        The window, or None for a model (or a server) the catalogue does not
        know or whose window it does not give.

    Example:
        ```python
        known_window("gpt-4o", provider="openai")  # 128000
        known_window("my-fine-tune", provider="openai")  # None
        ```
    """
    _checks.check(model, "model", _checks.string(non_empty=True))
    try:
        _, info = _catalogue().find_provider_model(model, None, provider, api_url)
    except LookupError:
        return None
    window = info.context_window
    return window if isinstance(window, int) and window > 0 else None


_PRICE: Final = "a price: a finite number >= 0 (dollars per million tokens)"


def _price(name: str, value: object) -> Decimal:
    """`value` as a `Decimal` price, if it is a finite number >= 0; else raise."""
    if isinstance(value, Decimal):
        price = value
    elif isinstance(value, float) and _checks.is_finite(value):
        # By its shortest text: 0.1 is Decimal("0.1"), not 0.1000000000000000055...
        price = Decimal(str(value))
    elif _checks.is_int(value):
        price = Decimal(value)  # type: ignore[arg-type]  # is_int: an int
    else:
        raise ConfigError(name, value, _PRICE)
    if not price.is_finite() or price < 0:
        raise ConfigError(name, value, _PRICE)
    return price


def _tiers(name: str, value: object, prices: int) -> tuple[tuple[Any, ...], ...]:
    """`value` as tiers ``(start, price, ...)``, lowest start first.

    Each tier is a start (an int >= 0) and `prices` prices; the starts rise.
    """
    fields = "start, input, cached_input, output" if prices == 3 else "start, price"
    expected = f"({fields})"
    tiers = _checks.as_tuple(value, name, f"tiers {expected}")
    made: list[tuple[Any, ...]] = []
    for i, tier in enumerate(tiers):
        where = f"{name}[{i}]"
        if isinstance(tier, str | bytes) or not _checks.is_iterable(tier):
            raise ConfigError(where, tier, f"a tier {expected}")
        items = tuple(tier)
        if len(items) != prices + 1:
            raise ConfigError(where, tier, f"a tier {expected}")
        start = items[0]
        if not _checks.is_int(start) or start < 0:
            raise ConfigError(f"{where} start", start, "an int >= 0 (input tokens)")
        if made and start <= made[-1][0]:
            raise ConfigError(
                f"{where} start",
                start,
                f"a start above the tier before's ({made[-1][0]}): lowest start first",
            )
        made.append((start, *(_price(f"{where}", p) for p in items[1:])))
    return tuple(made)


# attrs converters (named functions, as mypy's attrs plugin reads them).
def _input(value: object) -> Decimal:
    return _price("input", value)


def _cached_input(value: object) -> Decimal:
    return _price("cached_input", value)


def _output(value: object) -> Decimal:
    return _price("output", value)


def _cache_write(value: object) -> Decimal | None:
    return None if value is None else _price("cache_write", value)


def _input_tiers(value: object) -> tuple[tuple[Any, ...], ...]:
    return _tiers("tiers", value, 3)


def _write_tiers(value: object) -> tuple[tuple[Any, ...], ...]:
    return _tiers("write_tiers", value, 1)


@final
@_checks.keyword_checked
@attrs.frozen(kw_only=True)
class ModelPrices:
    """A model's prices in US dollars per million tokens (input, cached, output).

    Attributes:
        model: The model's name, as the catalogue knows it.
        input: Per million input tokens.
        cached_input: Per million input tokens a prompt cache serves.
        output: Per million output tokens.
        tiers: Higher prices from a number of input tokens on, as
            ``(start, input, cached_input, output)``, lowest start first.
        cache_write: Per million input tokens written to a prompt cache,
            when the provider prices writing apart (Anthropic); None: a
            write costs the input price (OpenAI's automatic caching).
        write_tiers: Higher write prices from a number of input tokens
            on, as ``(start, cache_write)``, lowest start first.
        provider: The id of the provider whose prices these are
            (``openai``, ``anthropic``; "" when not known).
    """

    model: str = attrs.field(validator=_checks.string())
    input: Decimal = attrs.field(converter=_input)
    cached_input: Decimal = attrs.field(converter=_cached_input)
    output: Decimal = attrs.field(converter=_output)
    tiers: tuple[tuple[int, Decimal, Decimal, Decimal], ...] = attrs.field(
        default=(), converter=_input_tiers
    )
    cache_write: Decimal | None = attrs.field(default=None, converter=_cache_write)
    write_tiers: tuple[tuple[int, Decimal], ...] = attrs.field(
        default=(), converter=_write_tiers
    )
    provider: str = attrs.field(default="", validator=_checks.string())

    def rates(self, input_tokens: int) -> tuple[Decimal, Decimal, Decimal]:
        """The input, cached-input and cache-write prices for a request's size.

        The tier of `input_tokens` applies (the base prices below the
        first); the write price is the input price when the provider prices
        no writes apart.

        Example:
            ```python
            known_prices("claude-sonnet-4-5").rates(1_000)
            # (Decimal('3'), Decimal('0.3'), Decimal('3.75'))
            ```
        """
        fresh, cached, write = self.input, self.cached_input, self.cache_write
        for start, tier_input, tier_cached, _ in self.tiers:
            if input_tokens >= start:
                fresh, cached = tier_input, tier_cached
        for start, tier_write in self.write_tiers:
            if input_tokens >= start:
                write = tier_write
        return fresh, cached, fresh if write is None else write

    def cost(
        self,
        input_tokens: int,
        cached_tokens: int,
        output_tokens: int,
        *,
        written_tokens: int = 0,
    ) -> Decimal:
        """The price of one call: its input (`cached_tokens` of it cached) and output.

        `written_tokens` of the uncached input are written to the prompt
        cache, at `cache_write` (the input price when it is None).

        Example:
            ```python
            known_prices("gpt-4o").cost(1_000_000, 0, 0)  # Decimal('2.50')
            ```
        """
        rates = (self.input, self.cached_input, self.output)
        for start, *tier in self.tiers:
            if input_tokens >= start:
                rates = (tier[0], tier[1], tier[2])
        fresh = max(0, input_tokens - cached_tokens)
        written = min(fresh, max(0, written_tokens))
        total = (
            (fresh - written) * rates[0]
            + written * self.rates(input_tokens)[2]
            + min(cached_tokens, input_tokens) * rates[1]
            + output_tokens * rates[2]
        )
        return total / 1_000_000

    def usage_cost(self, usage: Usage | None) -> Decimal:
        """The price of one call from its reported usage.

        The input the prompt cache served (`Usage.cache_read_tokens`) is
        priced at `cached_input`, that written to it
        (`Usage.cache_write_tokens`) at the write price, the rest at
        `input`.

        Example:
            ```python
            known_prices("gpt-4o").usage_cost(Usage(input_tokens=1_000_000))
            # Decimal('2.50')
            ```
        """
        if usage is None:
            return Decimal(0)
        return self.cost(
            usage.input_tokens,
            usage.cache_read_tokens,
            usage.output_tokens,
            written_tokens=usage.cache_write_tokens,
        )


def _rate(value: Any) -> tuple[Decimal | None, dict[int, Decimal]]:
    """A catalogue price: its base and its tiers by start (none: no price)."""
    if value is None:
        return None, {}
    if isinstance(value, Decimal):
        return value, {}
    return value.base, {t.start: t.price for t in value.tiers}


def known_prices(
    model: str, *, provider: str | None = None, at: datetime | None = None
) -> ModelPrices | None:
    """Return a known model's prices, or None if the catalogue has none.

    The figures come from the catalogue bundled with the ``genai-prices``
    package (the one `known_window` reads); nothing is fetched.

    Args:
        model: The model's name (``gpt-4o``, ``claude-sonnet-4-5``).
        provider: The provider's id; None: the one whose models the name
            looks like.
        at: When the prices apply (None: now).

    Example:
        ```python
        known_prices("gpt-4o").output  # Decimal('10')
        ```
    """
    _checks.check(model, "model", _checks.string(non_empty=True))
    try:
        found, info = _catalogue().find_provider_model(model, None, provider, None)
    except LookupError:
        return None
    prices = info.get_prices(at or datetime.now(UTC))
    fresh, fresh_tiers = _rate(getattr(prices, "input_mtok", None))
    if fresh is None:
        return None
    cached, cached_tiers = _rate(getattr(prices, "cache_read_mtok", None))
    write, write_tiers = _rate(getattr(prices, "cache_write_mtok", None))
    out, out_tiers = _rate(getattr(prices, "output_mtok", None))
    tiers = tuple(
        (
            start,
            fresh_tiers[start],
            cached_tiers.get(start, cached if cached is not None else price),
            out_tiers.get(start, out or Decimal(0)),
        )
        for start, price in sorted(fresh_tiers.items())
    )
    return ModelPrices(
        model=info.id,
        input=fresh,
        cached_input=cached if cached is not None else fresh,
        output=out or Decimal(0),
        tiers=tiers,
        cache_write=write,
        write_tiers=tuple(sorted(write_tiers.items())),
        provider=found.id,
    )


def server_window(base_url: str, *, timeout: float = 2.0) -> int | None:
    """Ask a llama.cpp server for its window (``n_ctx``); None if it does not say.

    llama.cpp's ``llama-server`` tells its ``n_ctx`` at ``/props``; a server
    that does not answer there (llama-cpp-python's, an OpenAI-compatible
    server of another kind) or cannot be reached gives None.

    Args:
        base_url: the server's OpenAI-compatible base URL
            (``http://127.0.0.1:8080/v1``).
        timeout: seconds to wait for the answer.
    """
    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        with urllib.request.urlopen(f"{root}/props", timeout=timeout) as reply:
            data: Any = json.load(reply)
    except (urllib.error.URLError, OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    settings = data.get("default_generation_settings")
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    if n_ctx is None:
        n_ctx = data.get("n_ctx")
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 1:
        return None
    return n_ctx


_CLIENT: Final = _checks.instance(
    ModelClient,
    "a model client (async complete()), or an object stating its window "
    "in an int attribute context_window",
)


def _check_model(model: object) -> None:
    """Refuse `model` unless it may be a run's model client.

    A model's name is refused showing where a name's window is looked up
    (`known_window`): here `model` is what `Driver(model=...)` takes, as
    there, and a name read as a client that states no window would get
    `FALLBACK_WINDOW` in its place. So would a class, a number or None.
    """
    if isinstance(model, str):
        known = known_window(model) if model.strip() else None
        found = f" ({known})" if known is not None else ""
        raise ConfigError(
            "model",
            model,
            "a model client, not a model's name: a client states its window "
            f"(OpenAIModel({model!r}) does); known_window({model!r}) looks up "
            f"a name's{found}",
        )
    if isinstance(model, type) or not hasattr(model, "context_window"):
        _checks.check(model, "model", _CLIENT)


def window_for(
    model: object, window: int | None = None, *, field: str = "context_window"
) -> int:
    """Return the window a run on `model` works in; refuse one larger than the model's.

    The model's window is the one its client states in an int attribute
    ``context_window`` (`OpenAIModel` and `AnthropicModel` take it from
    `known_window`; a llama.cpp server's client is given the server's
    ``n_ctx``). Then:

    - `window` given: used as given when the model's window is not known
      (a custom model, a fine-tune, a local server that does not say) or
      is at least as large; refused when larger;
    - `window` None: the model's window, else `FALLBACK_WINDOW` (200,000).

    Args:
        model: the model client (or any object stating its window in an
            int attribute ``context_window``), not a model's name:
            `known_window` looks a name up.
        window: the configured window in tokens, or None.
        field: the setting's name, as the user wrote it, for the error.

    Raises:
        WindowTooLarge: `window` is larger than the model's known window
            (names `field`, the value and the model's figure).
        ConfigError: `model` is a model's name (shown with `known_window`),
            a class, or another value that is neither a `ModelClient` nor
            states its window (field ``model``); or the client's
            ``context_window`` is not an int >= 1 or None.
    """
    _check_model(model)
    known: Any = getattr(model, "context_window", None)
    _checks.check(known, "model.context_window", _WINDOW)
    if window is None:
        return known if known is not None else FALLBACK_WINDOW
    if known is not None and window > known:
        name = getattr(model, "model", None)
        raise WindowTooLarge(
            field,
            window,
            f"at most {known}",
            model=name if isinstance(name, str) else type(model).__name__,
            window=known,
        )
    return window
