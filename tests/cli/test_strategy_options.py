"""Every ``--strategy`` option takes the shipped strategies' names from one list.

`turnfsm.context.STRATEGIES` names them; each command offers all of them or
a documented subset, and a name outside it is refused naming the option.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from turnfsm import Agent, Session, SQLiteStore
from turnfsm.cli import _parser, main
from turnfsm.cli._eval import strategy_maker
from turnfsm.cli._run import compactor
from turnfsm.context import STRATEGIES
from turnfsm.errors import ConfigError
from turnfsm.testing import ExtractiveSummaryModel, ScriptedModel

AGENT = ("masking", "truncating", "summarizing", "layered")  # all but digest
DEMO = ("truncating", "summarizing", "layered")  # cut inside the newest exchange
EVERY = tuple(STRATEGIES)

# the command line before ``--strategy NAME``, what it accepts
PARSED = [
    (["demo"], DEMO),
    (["run", "the task"], AGENT),
    *(
        ([action, "ses_1"], AGENT)
        for action in ("approve", "reject", "resume", "abandon")
    ),
]


def test_the_subsets_are_the_registrys_names_in_its_order() -> None:
    assert EVERY == ("masking", "truncating", "summarizing", "layered", "digest")
    for subset in (AGENT, DEMO):
        assert subset == tuple(name for name in EVERY if name in subset)


def _accepted(argv: list[str], name: str) -> bool:
    try:
        args = _parser().parse_args([*argv, "--strategy", name])
    except SystemExit:
        return False
    assert args.strategy == name
    return True


@pytest.mark.parametrize(("argv", "expected"), PARSED)
def test_each_parsed_option_accepts_exactly_its_names(
    argv: list[str], expected: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    accepted = tuple(n for n in [*EVERY, "nope"] if _accepted(argv, n))
    assert accepted == expected
    assert "invalid choice: 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "expected"), PARSED)
def test_each_parsed_option_lists_its_names_in_help(
    argv: list[str], expected: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args([argv[0], "--help"])
    assert "{" + ",".join(expected) + "}" in capsys.readouterr().out


@pytest.mark.parametrize("name", EVERY)
def test_run_and_simulate_build_exactly_the_agent_names(name: str) -> None:
    if name in AGENT:
        assert type(compactor(name)) is STRATEGIES[name]
        return
    with pytest.raises(ConfigError) as raised:
        compactor(name)
    assert str(raised.value).startswith(
        f"invalid --strategy={name!r}: expected "
        "masking | truncating | summarizing | layered ("  # and why not this one
    )


def test_simulate_help_names_the_agent_names(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["simulate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "with its defaults: masking, truncating, summarizing or layered" in (
        help_text
    )


@pytest.mark.parametrize("name", EVERY)
def test_eval_builds_every_name(name: str) -> None:
    made = strategy_maker(name)(ExtractiveSummaryModel())
    assert type(made) is STRATEGIES[name]


def test_eval_refuses_an_unknown_name_with_every_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(ConfigError) as raised:
        strategy_maker("nope")
    assert str(raised.value) == (
        "invalid --strategy='nope': expected masking | truncating | "
        "summarizing | layered | digest, or MODULE:ATTR"
    )
    with pytest.raises(SystemExit):
        _parser().parse_args(["eval", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "masking, truncating, summarizing, layered, digest, or your" in help_text


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["simulate", "ses_x", "--strategy", "lyered"],
            "turnfsm simulate: invalid --strategy='lyered': expected masking | "
            "truncating | summarizing | layered (did you mean 'layered'?)",
        ),
        (
            ["eval", "--strategy", "digets"],
            "turnfsm eval: invalid --strategy='digets': expected masking | "
            "truncating | summarizing | layered | digest, or MODULE:ATTR (did "
            "you mean 'digest'?)",
        ),
    ],
)
def test_a_misspelt_strategy_names_the_one_it_is_closest_to(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The options argparse checks said it (--strategy sumarizing on run);
    # simulate's and eval's, checked by turnfsm, listed the names only.
    store = str(tmp_path / "s.db")

    async def one_session() -> None:
        async with SQLiteStore(store) as kept:
            agent = Agent(model=ScriptedModel.of("ok"), store=kept)
            await agent.run("hi", session=await Session.open(kept, "ses_x"))

    anyio.run(one_session)
    assert main([*argv, "--store", store]) == 2
    assert said in capsys.readouterr().err
