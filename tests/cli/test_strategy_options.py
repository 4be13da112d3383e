"""Every ``--strategy`` option takes the shipped strategies' names from one list.

`turnfsm.context.STRATEGIES` names them; each command offers all of them or
a documented subset, and a name outside it is refused naming the option.
"""

from __future__ import annotations

import pytest

from turnfsm.cli import _parser
from turnfsm.cli._eval import strategy_maker
from turnfsm.cli._run import compactor
from turnfsm.context import STRATEGIES
from turnfsm.errors import ConfigError
from turnfsm.testing import ExtractiveSummaryModel

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
    assert str(raised.value) == (
        f"invalid --strategy={name!r}: expected "
        "masking | truncating | summarizing | layered"
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
