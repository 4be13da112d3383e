"""`HookDispatcher` takes only what the driver takes: checked where it is made."""

from __future__ import annotations

from typing import Any

import pytest

from turnfsm.errors import ConfigError
from turnfsm.hooks import Hook, HookDispatcher, RunEndInfo


class Ends(Hook):
    def on_run_end(self, info: RunEndInfo) -> None:
        pass


class Misspelt(Hook):
    def on_run_ended(self, info: object) -> None:
        """Never called: no hook method has this name."""


class Async(Hook):
    async def on_run_end(self, info: RunEndInfo) -> None:  # type: ignore[override]
        pass


ends = Ends()


@pytest.mark.parametrize(
    ("hooks", "field", "value"),
    [
        (None, "hooks", None),
        ("x", "hooks", "x"),
        (["x"], "hooks[0]", "x"),
        ([Ends], "hooks[0]", Ends),
        ([ends, ends], "hooks[1]", ends),
        ([Misspelt()], "hooks[0].on_run_ended", None),
        ([Async()], "hooks[0].on_run_end", None),
    ],
    ids=["None", "a string", "not a hook", "a class", "twice", "misspelt", "async"],
)
def test_a_dispatcher_refuses_what_the_driver_refuses(
    hooks: Any, field: str, value: object
) -> None:
    # Each was taken (None raised a bare TypeError); the run then failed in
    # a hook call, or called a hook twice, or never called it.
    with pytest.raises(ConfigError) as caught:
        HookDispatcher.of(hooks)
    assert caught.value.field == field
    if value is not None:
        assert caught.value.value is value or caught.value.value == value
    with pytest.raises(ConfigError) as again:
        HookDispatcher(hooks)
    assert again.value.field == field


@pytest.mark.parametrize("strict", ["yes", 1, None])
def test_a_dispatcher_s_strict_is_a_bool(strict: object) -> None:
    with pytest.raises(ConfigError) as caught:
        HookDispatcher.of([Ends()], strict=strict)  # type: ignore[arg-type]
    assert caught.value.field == "strict"
    assert caught.value.value == strict


def test_a_dispatcher_of_good_hooks_calls_them() -> None:
    heard: list[str] = []

    class Hears(Hook):
        def on_run_end(self, info: RunEndInfo) -> None:
            heard.append(info.run_id)

    dispatcher = HookDispatcher.of((Hears(),), strict=True)
    assert dispatcher.wants("on_run_end")
    assert not dispatcher.wants("on_run_start")
    assert HookDispatcher.of([]).hooks == []


@pytest.mark.parametrize("raised", [SystemExit(2), GeneratorExit()])
def test_a_hook_that_exits_is_detached_and_the_run_goes_on(
    raised: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    # A non-strict hook that called sys.exit() crashed the run, and the
    # results of the tools it had run were never committed.
    class Exits(Hook):
        def on_run_end(self, info: RunEndInfo) -> None:
            raise raised

    hook = Exits()
    dispatcher = HookDispatcher.of([hook])

    dispatcher.call("on_run_end", object())

    assert not dispatcher.wants("on_run_end")
    assert "raised in on_run_end; detaching it" in caplog.text
    with pytest.raises(type(raised)):
        HookDispatcher.of([Exits()], strict=True).call("on_run_end", object())


def test_a_ctrl_c_in_a_hook_is_the_user_s() -> None:
    class Interrupted(Hook):
        def on_run_end(self, info: RunEndInfo) -> None:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        HookDispatcher.of([Interrupted()]).call("on_run_end", object())
