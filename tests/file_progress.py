"""A pytest plugin for `make test`: under xdist, one line per test file as it finishes.

xdist's progress is dots only, so minutes pass without saying which file is
running. With `--dist loadfile` a worker runs one file's tests back to back,
so a worker's report from a new file means its previous file is done. Loaded
with `-p file_progress` (tests/ on PYTHONPATH); a no-op without xdist, whose
own progress names files.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pytest


@dataclass
class _File:
    path: str
    seconds: float = 0.0  # set-up, call and tear-down durations of its tests
    outcomes: Counter = field(default_factory=Counter)


class FileProgress:
    def __init__(self, terminal) -> None:
        self.terminal = terminal
        self.current: dict[str, _File] = {}  # worker id -> the file it is running

    def _finish(self, worker: str) -> None:
        done = self.current.pop(worker, None)
        if done is None:
            return
        counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(done.outcomes.items()))
        if self.terminal._tw.width_of_current_line:  # end the line of dots first
            self.terminal.write("\n")
        self.terminal.write_line(f"{done.path}: {counts} in {done.seconds:.1f} s [{worker}]")

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        worker = getattr(getattr(report, "node", None), "gateway", None)
        if worker is None:
            return
        worker_id = worker.id
        path = report.nodeid.split("::")[0]
        running = self.current.get(worker_id)
        if running is None or running.path != path:
            self._finish(worker_id)
            running = self.current[worker_id] = _File(path)
        running.seconds += report.duration
        if report.when == "call" or report.outcome != "passed":
            running.outcomes[report.outcome] += 1

    @pytest.hookimpl
    def pytest_sessionfinish(self) -> None:
        for worker in list(self.current):
            self._finish(worker)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    if hasattr(config, "workerinput") or terminal is None:
        return
    config.pluginmanager.register(FileProgress(terminal), "file-progress")
