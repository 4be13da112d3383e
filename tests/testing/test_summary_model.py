"""`ExtractiveSummaryModel` refuses a `max_facts` that is no count of facts."""

from __future__ import annotations

from typing import Any

import pytest

from turnfsm.errors import ConfigError
from turnfsm.testing import ExtractiveSummaryModel


@pytest.mark.parametrize(
    "max_facts",
    [0, -1, "x", True, 2.5, None, 10**9],
    ids=["zero", "negative", "str", "bool", "float", "none", "huge"],
)
def test_a_max_facts_that_is_no_count_is_refused_when_made(max_facts: Any) -> None:
    # -1 dropped the last fact, True meant 1, "x" and 2.5 raised TypeError
    # inside complete().
    with pytest.raises(ConfigError) as caught:
        ExtractiveSummaryModel(max_facts=max_facts)
    assert (caught.value.field, caught.value.value) == ("max_facts", max_facts)


def test_a_positive_max_facts_is_taken() -> None:
    assert ExtractiveSummaryModel(max_facts=1).max_facts == 1
    assert ExtractiveSummaryModel().max_facts == 40
