"""`Tool(in_subprocess=True)`: a plain function tool a timeout or a cancel kills."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from tests.driver import decorated_tool, isolated_tools
from tests.helpers import REPO_ROOT
from turnfsm.driver import Driver, RunControl, Session, Tool
from turnfsm.driver._child import answer, main
from turnfsm.driver._tools import run_tool_call, tools_by_name
from turnfsm.errors import Cancelled, ToolError
from turnfsm.messages import ToolCallPart
from turnfsm.testing import ScriptedModel, reply, tool_call

pytestmark = pytest.mark.anyio


def isolated(*fns: object) -> dict[str, Tool]:
    return tools_by_name(
        [Tool.from_function(fn, in_subprocess=True) for fn in fns]  # type: ignore[arg-type]
    )


async def call(
    tools: dict[str, Tool], name: str, /, **arguments: object
) -> tuple[str, bool]:
    part = ToolCallPart(id="c1", name=name, arguments=arguments)  # type: ignore[arg-type]
    result = (await run_tool_call(part, tools, limit=10)).tool_results[0]
    return result.content, result.is_error


async def wait_for(path: Path, seconds: float) -> None:
    """Wait for a file another process writes (no event can say so)."""
    with anyio.fail_after(seconds):
        while not await anyio.Path(path).exists():  # noqa: ASYNC110
            await anyio.sleep(0.01)


async def exists(path: Path | str) -> bool:
    return await anyio.Path(path).exists()


async def test_the_tool_runs_in_another_process_and_its_result_comes_back() -> None:
    tools = isolated(isolated_tools.pid, isolated_tools.describe_job)
    content, is_error = await call(tools, "pid")
    assert not is_error
    assert int(content) != os.getpid()
    content, is_error = await call(tools, "describe_job", name="nightly", retries=2)
    assert (content, is_error) == (
        '{"type": "Job", "name": "nightly", "retries": 2}',
        False,
    )
    tools = isolated(isolated_tools.job_back)
    content, is_error = await call(tools, "job_back", name="nightly", retries=2)
    assert (content, is_error) == ('{"name": "nightly", "retries": 2}', False)


async def test_an_exception_in_the_child_is_an_error_result_naming_it() -> None:
    tools = isolated(isolated_tools.fail, isolated_tools.crash)
    assert await call(tools, "fail", message="disk on fire") == (
        "tool 'fail' failed: ValueError: disk on fire",
        True,
    )
    content, is_error = await call(tools, "crash")
    assert is_error
    assert "ended with code 7 and no result" in content


async def test_bad_arguments_are_refused_before_a_process_starts() -> None:
    tools = isolated(isolated_tools.pid, isolated_tools.sleep_then_write)
    content, is_error = await call(tools, "sleep_then_write", path=3, seconds="1")
    assert is_error
    assert "- path: expected string, got 3 (integer)" in content
    assert '- seconds: expected number, got "1" (string)' in content


async def test_a_timeout_kills_the_child_so_its_side_effect_never_happens(
    tmp_path: Path,
) -> None:
    """The issue's case: a plain function that sleeps, then writes a file."""
    target = tmp_path / "written"
    sleep = 0.8
    tool = Tool.from_function(isolated_tools.sleep_then_write, in_subprocess=True)
    model = ScriptedModel.of(
        reply("", tool_call("sleep_then_write", "c1", path=str(target), seconds=sleep)),
        "gave up",
    )
    session = Session()
    started = anyio.current_time()
    with anyio.fail_after(5):
        result = await Driver(model=model, tools=[tool], tool_timeout=0.6).run(
            "go", session=session
        )
    assert result.ok
    assert session.history[2].tool_results[0].content == (
        "tool 'sleep_then_write' timed out after 0.6s"
    )
    assert await exists(f"{target}.started")  # it was running when it was killed
    # Past the time the tool would have written the file: it never does.
    await anyio.sleep(max(0.0, started + sleep + 0.3 - anyio.current_time()))
    assert not await exists(target)


async def test_a_cancel_kills_the_child_and_the_programs_it_started(
    tmp_path: Path,
) -> None:
    """A shell the tool started (a grandchild) is in the killed process group."""
    target = tmp_path / "written"
    sleep = 0.5
    control = RunControl()
    tool = Tool.from_function(isolated_tools.shell_then_write, in_subprocess=True)
    model = ScriptedModel.of(
        reply("", tool_call("shell_then_write", "c1", path=str(target), seconds=sleep)),
        "never",
    )
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:

            async def stop() -> None:
                await wait_for(Path(f"{target}.started"), 4)
                control.cancel("user pressed stop")

            group.start_soon(stop)
            result = await Driver(model=model, tools=[tool]).run("go", control=control)
    assert isinstance(result.error, Cancelled)
    await anyio.sleep(sleep + 0.3)
    assert not await exists(target)


async def test_a_cancelled_scope_kills_the_child_before_the_cancel_goes_on(
    tmp_path: Path,
) -> None:
    target = tmp_path / "written"
    tools = isolated(isolated_tools.sleep_then_write)
    part = ToolCallPart(
        id="c1",
        name="sleep_then_write",
        arguments={"path": str(target), "seconds": 0.5},
    )
    with anyio.fail_after(5), anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:

            async def stop() -> None:
                await wait_for(Path(f"{target}.started"), 4)
                scope.cancel()

            group.start_soon(stop)
            await run_tool_call(part, tools, limit=None)
    assert scope.cancelled_caught
    await anyio.sleep(0.7)
    assert not await exists(target)


def test_a_decorated_tool_is_found_through_the_tool_its_name_is_bound_to() -> None:
    request = {
        "path": list(sys.path),
        "main": None,
        "module": "tests.driver.decorated_tool",
        "qualname": "double",
        "kwargs": pickle.dumps({"n": 2}),
    }
    assert answer(pickle.dumps(request)) == ("ok", "4")


# One backend: the child imports turnfsm, so it takes longer to start.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_decorator_takes_in_subprocess() -> None:
    double = decorated_tool.double
    assert double.in_subprocess
    assert await call({"double": double}, "double", n=21) == ("42", False)


def test_the_child_reports_a_tool_it_cannot_find() -> None:
    request = {
        "path": list(sys.path),
        "main": None,
        "module": "tests.driver.isolated_tools",
        "qualname": "missing",
        "kwargs": pickle.dumps({}),
    }
    kind, name, message = answer(pickle.dumps(request))
    assert (kind, name) == ("raised", "AttributeError")
    assert "missing" in message


def test_tools_a_child_cannot_import_are_refused_when_built() -> None:
    def local() -> str:
        return ""

    async def coroutine() -> str:
        return ""

    with pytest.raises(ToolError, match="top level of a module"):
        Tool.from_function(local, in_subprocess=True)
    with pytest.raises(ToolError, match="top level of a module"):
        Tool.from_function(lambda: "", name="anon", in_subprocess=True)
    with pytest.raises(ToolError, match="sync functions"):
        Tool.from_function(coroutine, in_subprocess=True)


def test_the_child_writes_one_pickled_answer() -> None:
    request = {
        "path": list(sys.path),
        "main": None,
        "module": "tests.driver.isolated_tools",
        "qualname": "describe_job",
        "kwargs": pickle.dumps({"job": isolated_tools.Job(name="j")}),
    }
    out = io.BytesIO()
    main(io.BytesIO(pickle.dumps(request)), out)
    assert pickle.loads(out.getvalue()) == (
        "ok",
        '{"type": "Job", "name": "j", "retries": 0}',
    )


SCRIPT = """
import anyio
from turnfsm.driver import Tool
from turnfsm.driver._tools import run_tool_call
from turnfsm.messages import ToolCallPart


def double(x: int) -> int:
    return x * 2


async def go() -> None:
    tool = Tool.from_function(double, in_subprocess=True)
    part = ToolCallPart(id="c1", name="double", arguments={"x": 21})
    result = await run_tool_call(part, {"double": tool}, limit=10)
    print(result.tool_results[0].content)


if __name__ == "__main__":
    anyio.run(go)
"""


def test_a_tool_defined_in_the_main_script_runs_in_the_child(tmp_path: Path) -> None:
    script = tmp_path / "agent.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=30,
    )
    assert done.stdout.strip() == "42"


UNGUARDED = """
import os

from turnfsm import Agent
from turnfsm.driver import function_tool
from turnfsm.testing import FakeModelClient, reply, tool_call


@function_tool(in_subprocess=True)
def pid() -> str:
    \"\"\"Say which process runs the tool.\"\"\"
    return f"pid {os.getpid()}"


def model(request):
    last = request.messages[-1]
    if last.tool_results:
        return reply(last.tool_results[0].content)
    return reply("", tool_call("pid", "c1"))


print("run in", os.getpid())
agent = Agent(model=FakeModelClient(model), tools=[pid])
print("answer:", agent.run_sync("Which process?").text)
"""


def test_a_script_that_runs_its_agent_unguarded_is_not_run_again_by_the_tool(
    tmp_path: Path,
) -> None:
    # The tool's process loaded the script to find the tool, and the script's
    # top level ran the agent again there (its model called, its store
    # written, its output printed), whose own tool call then failed with
    # "ModuleNotFoundError: No module named '__mp_main__'".
    script = tmp_path / "agent.py"
    script.write_text(UNGUARDED)
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=30,
    )
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["run", "answer:"], done.stdout
    # The tool's process ran the script up to its run, not the run.
    assert "answer:" not in done.stderr, done.stderr
    assert lines[1] == (
        f"answer: tool 'pid' failed: ConfigError: invalid __main__={str(script)!r}: "
        'expected a script that starts its runs under `if __name__ == "__main__":`; '
        "an in_subprocess tool's process loads the script to find the tool, and "
        "would run the agent again, calling its model and writing its store, on "
        "every call"
    )
