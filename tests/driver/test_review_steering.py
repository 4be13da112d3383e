"""A message injected while the review machine's reviewer works is heard."""

from __future__ import annotations

import anyio

from turnfsm import Agent, review_machine
from turnfsm.core import Event, Perform, Signal
from turnfsm.driver import EffectContext, RunControl, replay
from turnfsm.messages import Message
from turnfsm.providers import ModelRequest
from turnfsm.testing import FakeModelClient, reply

STEER = "Also: answer in French."


def test_a_message_injected_during_the_review_is_answered_and_kept() -> None:
    # The run ended done on `approved` with the message left in the inbox:
    # the model never saw it and the session never kept it.
    control = RunControl()
    requests: list[list[str]] = []

    def model(request: ModelRequest) -> Message:
        requests.append([m.text for m in request.messages])
        return reply("réponse" if len(requests) > 1 else "answer")

    async def review(ctx: EffectContext, decision: Perform) -> Event:
        if len(requests) == 1:  # steering arrives while the first is reviewed
            control.inject(Message.user(STEER))
        return Signal("approved")

    agent = Agent(
        model=FakeModelClient(model),
        machine=review_machine(),
        effects={"review": review},
    )

    async def main() -> None:
        result = await agent.run("Where is Paris?", control=control)
        assert (result.outcome, result.text) == ("done", "réponse")

    anyio.run(main)

    assert requests[-1] == ["Where is Paris?", "answer", STEER]
    history = [m.text for m in agent.session.history]
    assert history == ["Where is Paris?", "answer", STEER, "réponse"]
    assert replay(None, agent.session, agent.session.runs[-1].run_id).ok
