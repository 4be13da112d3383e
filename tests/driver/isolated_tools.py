"""Tools for `test_tool_subprocess.py`, importable in a child process.

A ``Tool(in_subprocess=True)`` finds its function in the child by module and
name, so these live at the top level of a module that imports little (a
child that starts fast keeps the tests short).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import attrs


def sleep_then_write(path: str, seconds: float) -> str:
    """Mark the start, sleep, then write `path`: the side effect a kill prevents."""
    _touch(path + ".started")
    time.sleep(seconds)
    _touch(path)
    return "written"


def shell_then_write(path: str, seconds: float) -> str:
    """Have a shell (a grandchild) sleep, then write `path`."""
    _touch(path + ".started")
    subprocess.run(["sh", "-c", f'sleep {seconds}; touch "{path}"'], check=True)
    return "written"


def fail(message: str) -> str:
    """Raise, after printing to stdout (which must not corrupt the answer)."""
    print("about to fail")
    raise ValueError(message)


def crash() -> str:
    """End the process without an answer."""
    sys.stdout.flush()
    os._exit(7)


def pid() -> int:
    """Return the process id the tool ran in."""
    return os.getpid()


@attrs.frozen
class Job:
    """A job to describe.

    Attributes:
        name: the job's name.
        retries: how often to retry.
    """

    name: str
    retries: int = 0


def describe_job(job: Job) -> dict[str, object]:
    """Describe a job, and where it ran."""
    return {"type": type(job).__name__, "name": job.name, "retries": job.retries}


def _touch(path: str) -> None:
    with open(path, "w") as f:
        f.write(str(time.time()))


def job_back(job: Job) -> Job:
    """Return the job itself: the child sends it as JSON of its fields."""
    return job
