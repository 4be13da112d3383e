"""Files the library writes: whole, or not left behind."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from turnfsm._files import write_text


def _cut_short() -> Iterator[str]:
    yield "first line\n"
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_file_cut_short_by_a_full_disk_is_removed(tmp_path: Path) -> None:
    # A session log cut mid-line was left behind, and the message named no file.
    path = tmp_path / "out.jsonl"
    path.write_text("what was there\n")

    with pytest.raises(OSError, match="No space left") as raised:
        write_text(path, _cut_short())

    assert raised.value.errno == errno.ENOSPC
    assert raised.value.filename == os.fspath(path)
    assert not path.exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
def test_a_device_is_written_as_it_is_and_never_removed() -> None:
    with pytest.raises(OSError, match="No space left") as raised:
        write_text("/dev/full", "text\n")
    assert raised.value.filename == "/dev/full"
    assert os.path.exists("/dev/full")


def test_a_whole_text_is_written(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    write_text(path, ["a\n", "b\n"])
    assert path.read_text(encoding="utf-8") == "a\nb\n"
