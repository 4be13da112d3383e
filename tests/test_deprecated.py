"""Old public names keep working for one release, each with a DeprecationWarning."""

from __future__ import annotations

import importlib

import pytest

from turnfsm import Driver, serde
from turnfsm.context import (
    CompactionProposal,
    CompactionRequest,
    ContextManager,
    TruncatingCompactor,
)
from turnfsm.core import CompactionResult, CompactReason
from turnfsm.errors import ProviderError
from turnfsm.hooks import Hook
from turnfsm.messages import Message
from turnfsm.persistence import CompactionRecord, Entry, Session, Verdict
from turnfsm.testing import ScriptedModel
from turnfsm.tokens import HeuristicTokenCounter

pytestmark = pytest.mark.anyio

COUNTER = HeuristicTokenCounter()


def long_history(n: int) -> list[Message]:
    out: list[Message] = []
    for i in range(n):
        out += [Message.user(f"q{i} " + "x" * 400), Message.assistant(f"a{i}")]
    return out


@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        ("turnfsm.context", "CompactionOutcome", CompactionProposal),
        ("turnfsm.context", "Compacted", None),
        ("turnfsm.context", "NoAction", None),
        ("turnfsm.context", "ContextOverflow", None),
        ("turnfsm.context", "CompactorError", None),
        ("turnfsm.context", "CircuitOpen", None),
        ("turnfsm.context", "CompactionDecision", None),
        ("turnfsm.hooks", "CompactionInfo", None),
        ("turnfsm.hooks", "CompactionDone", None),
    ],
)
def test_an_old_name_still_imports_with_a_warning(
    module: str, old: str, new: object
) -> None:
    package = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=f"{module}.{old} is deprecated"):
        value = getattr(package, old)
    assert old not in package.__all__
    if new is not None:
        assert value is new


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    package = importlib.import_module("turnfsm.context")
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        package.Nope  # noqa: B018


async def test_the_old_entry_points_answer_with_the_old_verdicts() -> None:
    manager = ContextManager(
        TruncatingCompactor(), context_window=2_000, counter=COUNTER
    )
    messages = long_history(8)
    with pytest.warns(DeprecationWarning, match="compact_with_reason"):
        old = await manager.compact_with_reason(
            messages, turn=0, reason=CompactReason.THRESHOLD_EXCEEDED
        )
    new = await manager.compact(
        CompactionRequest(messages=messages, reason=CompactReason.THRESHOLD_EXCEEDED)
    )
    assert isinstance(new, CompactionResult)
    assert type(old).__name__ == "Compacted"
    assert old.messages == new.messages  # type: ignore[union-attr]
    assert (old.tokens_before, old.tokens_after) == (new.before, new.after)  # type: ignore[union-attr]
    with pytest.warns(DeprecationWarning, match="ensure_context_fits"):
        under = await manager.ensure_context_fits(messages[:2], turn=0)
    assert type(under).__name__ == "NoAction"
    assert under.reason is None  # type: ignore[union-attr]
    with pytest.warns(DeprecationWarning, match="compact_manual"):
        manual = await manager.compact_manual(messages, turn=0)
    assert manual.reason is CompactReason.MANUAL
    with pytest.warns(DeprecationWarning, match="force_compact"):
        ephemeral = await manager.force_compact(messages, turn=0, ephemeral=True)
    assert type(ephemeral).__name__ == "NoAction"


class OldHook(Hook):
    def __init__(self) -> None:
        self.posts: list[object] = []
        self.compactions: list[object] = []
        self.done: list[object] = []

    def post_compact(self, info: object) -> None:
        self.posts.append(info)

    def on_compaction(self, info: object) -> None:
        self.compactions.append(info)

    def on_compaction_done(self, info: object) -> None:
        self.done.append(info)


class NewHook(Hook):
    def __init__(self) -> None:
        self.records: list[CompactionRecord] = []

    def on_compaction_pass(self, record: CompactionRecord) -> None:
        self.records.append(record)


async def test_the_old_compaction_hooks_hear_what_the_record_says() -> None:
    old, new = OldHook(), NewHook()
    manager = ContextManager(
        TruncatingCompactor(), context_window=1_000, counter=COUNTER
    )
    session = Session()
    driver = Driver(model=ScriptedModel.of("ok"), context=manager, hooks=[old, new])
    with pytest.warns(DeprecationWarning, match="OldHook") as caught:
        result = await driver.run(long_history(8), session=session)
    assert result.ok
    warned = {str(w.message).split(" is deprecated")[0] for w in caught}
    assert warned == {
        "OldHook.post_compact",
        "OldHook.on_compaction",
        "OldHook.on_compaction_done",
    }
    (record,) = new.records
    assert record == session.runs[0].compactions[0]
    assert record.compacted
    (post,) = old.posts
    (compaction,) = old.compactions
    assert post == compaction
    assert post.outcome == record.verdict  # type: ignore[attr-defined]
    assert post.tokens_saved == record.tokens_saved  # type: ignore[attr-defined]
    (done,) = old.done
    assert done.session_id == session.id  # type: ignore[attr-defined]
    assert done.trigger is record.reason  # type: ignore[attr-defined]
    assert done.covers == record.covers  # type: ignore[attr-defined]


def test_a_records_old_outcome_reads_its_verdict() -> None:
    record = CompactionRecord(
        run_id="r",
        turn=1,
        reason=CompactReason.EMERGENCY,
        strategy="S",
        verdict="stalled",
        covers=("a",),
        replacement=("a",),
        tokens_before=9,
        tokens_after=9,
        key="r:1",
    )
    with pytest.warns(DeprecationWarning, match="CompactionRecord.outcome"):
        assert record.outcome is record.verdict is Verdict.STALLED
    # Stored under the key logs were written with, before the rename.
    stored = serde.envelope(record)
    assert stored["data"]["outcome"] == "stalled"  # type: ignore[index, call-overload]
    assert serde.open_envelope(stored, Entry) == record


def test_a_provider_errors_old_retriable_still_builds_and_reads() -> None:
    with pytest.warns(DeprecationWarning, match=r"ProviderError\(retriable"):
        error = ProviderError("slow down", retriable=True, kind="rate_limit")
    assert error.retryable
    with pytest.warns(DeprecationWarning, match="ProviderError.retriable"):
        assert error.retriable


def test_a_renamed_field_keeps_its_stored_key() -> None:
    """A log written before `retryable` was named so reads the same."""
    error = ProviderError("slow down", retryable=True, kind="rate_limit")
    data = serde.error_to_json(error)
    assert data["retriable"] is True
    assert "retryable" not in data
    restored = serde.error_from_json(data)
    assert isinstance(restored, ProviderError)
    assert (restored.message, restored.retryable, restored.kind) == (
        "slow down",
        True,
        "rate_limit",
    )
