"""A whole 1-turn run of the driver, alone: its time, its calls, where it goes.

The same run as `orchestration.py`'s "a 1-turn run (open .. end)": one
Driver reused, a fresh Session each run, an instant model answering with
text (open, three events, end). Only that is measured, many times:

    python bench/one_turn_run.py             # best of 15 x 300 runs
    python bench/one_turn_run.py --profile   # + calls per run and the split

The time is the best of the repetitions, by the wall clock and by the
process's CPU time (steadier on a machine others share). The split is
cProfile's, as shares of the profiled run: cProfile inflates code made of
many small calls, so read it as proportions, not times.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import sys
import time
from typing import Any

import anyio

from bench.orchestration import InstantModel, _driver
from turnfsm.driver import Session

RUNS = 300
REPEATS = 15
PROFILED = 3_000


async def best_us() -> tuple[float, float]:
    """The best µs per run of `REPEATS` x `RUNS` runs: (wall, CPU)."""
    driver = _driver(InstantModel(1), 1, timeouts=True)
    wall = cpu = float("inf")
    for _ in range(REPEATS):
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(RUNS):
            await driver.run("go", session=Session())
        wall = min(wall, (time.perf_counter() - t0) / RUNS * 1e6)
        cpu = min(cpu, (time.process_time() - c0) / RUNS * 1e6)
    return wall, cpu


async def profiled() -> cProfile.Profile:
    """`PROFILED` runs under cProfile (after 100 unprofiled ones)."""
    driver = _driver(InstantModel(1), 1, timeouts=True)
    for _ in range(100):
        await driver.run("go", session=Session())
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(PROFILED):
        await driver.run("go", session=Session())
    profile.disable()
    return profile


def split(stats: pstats.Stats) -> list[tuple[str, float]]:
    """Shares of the profiled run: its start, its steps, its end."""
    table: dict[Any, tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]

    def cum(module: str, name: str) -> float:
        return sum(
            v[3] for k, v in table.items() if k[0].endswith(module) and k[2] == name
        )

    run = cum("driver/_driver.py", "run")
    going = cum("driver/_opening.py", "_going")
    steps = cum("driver/_loop.py", "feed") + cum("driver/_loop.py", "_effect")
    end = cum("driver/_ending.py", "end")
    return [
        ("start: Driver.run before the loop", (run - going) / run),
        ("  of it TurnMachine.start", cum("core/_machine.py", "start") / run),
        ("steps: 3 events fed (the first append) + 2 effects", steps / run),
        ("end (its append)", end / run),
        ("  the two appends (Session.append)", cum("_session.py", "append") / run),
    ]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--profile", action="store_true", help="also print where a run's time goes"
    )
    args = parser.parse_args(argv)
    wall, cpu = anyio.run(best_us)
    print(f"a 1-turn run: {wall:.1f} µs (wall), {cpu:.1f} µs (CPU), best of {REPEATS}")
    if not args.profile:
        return
    stats = pstats.Stats(anyio.run(profiled))
    table: dict[Any, tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    calls = sum(v[1] for v in table.values())
    print(f"{calls / PROFILED:.0f} Python calls per run (the harness's included)")
    for name, share in split(stats):
        print(f"  {name:52s} {share * 100:5.1f} %")
    stats.sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main(sys.argv[1:])
