"""Wall-clock and CPU seconds per phase of an evaluation, for ``benchmarks/bench_evaluate.py``'s breakdown.

The evaluation marks its phases with :func:`phase`; nothing is measured unless a caller collects them
with :func:`record_phases`, and measuring never changes what a phase computes.

>>> import time
>>> with record_phases() as times:
...     with phase("work"):
...         time.sleep(0.01)
...     with phase("work"):
...         pass
>>> list(times), times["work"]["wall"] >= 0.01, times["work"]["cpu"] < 0.01
(['work'], True, True)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

_recorders: list[dict[str, dict[str, float]]] = []


@contextlib.contextmanager
def record_phases() -> Iterator[dict[str, dict[str, float]]]:
    """Collect the phases run inside the block.

    Yields:
        {phase name: {"wall": seconds, "cpu": seconds of this process (all threads)}}, each summed over
        the phase's runs, in the order the phases first ran.
    """
    times: dict[str, dict[str, float]] = {}
    _recorders.append(times)
    try:
        yield times
    finally:
        _recorders.remove(times)


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Mark the block as (part of) phase ``name``; its times are added to every active recorder."""
    if not _recorders:
        yield
        return
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        for times in _recorders:
            entry = times.setdefault(name, {"wall": 0.0, "cpu": 0.0})
            entry["wall"] += wall
            entry["cpu"] += cpu
