"""The `Agent` façade: a driver plus the conversation it continues."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any, final

import anyio

from turnfsm.driver import Driver, RunControl, RunResult, Session
from turnfsm.messages import Message

__all__ = ["Agent"]


@final
class Agent:
    """An LLM agent on the Turn FSM.

    Takes the same keyword arguments as `Driver` (model, tools, system_prompt,
    context, max_turns, hooks, ...) and keeps a `session`, so consecutive
    runs continue one conversation.

    Example:
        ```python
        agent = Agent(model=my_model, tools=[search], system_prompt="Be brief.")
        result = await agent.run("What is in notes.md?")
        print(result.raise_for_failure().text)
        ```
    """

    __slots__ = ("driver", "session")

    def __init__(
        self, *, session: Session | None = None, **driver_options: Any
    ) -> None:
        """Build the driver from `driver_options`; start or continue `session`.

        Raises:
            ConfigError: a setting is out of range (the field is named).
        """
        self.driver = Driver(**driver_options)
        self.session = session if session is not None else Session()

    async def run(
        self,
        input: str | Message | Iterable[Message],
        *,
        session: Session | None = None,
        control: RunControl | None = None,
    ) -> RunResult:
        """Run one task to a final answer or a typed failure (see `Driver.run`)."""
        return await self.driver.run(
            input, session=session or self.session, control=control
        )

    def run_sync(
        self,
        input: str | Message | Iterable[Message],
        *,
        session: Session | None = None,
        backend: str = "asyncio",
    ) -> RunResult:
        """Run from synchronous code: `anyio.run` around `run` (no second code path)."""
        return anyio.run(
            functools.partial(self.run, input, session=session), backend=backend
        )

    def new_session(self) -> Session:
        """Start a fresh conversation for the following runs and return it."""
        self.session = Session()
        return self.session
