"""Progress of a long run on stderr: the step, the events done out of the total and the
rate, drawn by rich; nothing at all when stderr is not a terminal (logs, CI, Airflow),
so a run's output stays what it was."""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.progress import Progress as RichProgress
from rich.text import Text


class _RateColumn(ProgressColumn):
    """Events per second over the step so far."""

    def render(self, task: Task) -> Text:
        elapsed = task.elapsed
        if not elapsed or not task.completed:
            return Text("")
        return Text(f"{task.completed / elapsed:,.0f} events/s")


class Progress:
    """``step(name, total)`` starts a step (the previous one is done); ``update(done)`` sets
    the events the step has done; ``close()`` ends the display. Disabled, every call does
    nothing."""

    def __init__(self, enabled: bool | None = None, stream: TextIO | None = None) -> None:
        stream = sys.stderr if stream is None else stream
        self.enabled = stream.isatty() if enabled is None else enabled
        self.total: int | None = None
        self._task: TaskID | None = None
        self._bar: RichProgress | None = None
        if self.enabled:
            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                _RateColumn(),
                TimeElapsedColumn(),
                console=Console(file=stream, force_terminal=enabled or None),
                transient=False,
            )
            self._bar.start()

    def step(self, name: str, total: int | None = None) -> None:
        if total is not None:
            self.total = total
        bar = self._bar
        if bar is None:
            return
        if self._task is not None:
            bar.update(self._task, completed=bar.tasks[self._task].total)
            bar.stop_task(self._task)
        self._task = bar.add_task(name, total=self.total)

    def update(self, done: int) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=done)

    def close(self) -> None:
        if self._bar is None:
            return
        if self._task is not None:
            self._bar.update(self._task, completed=self._bar.tasks[self._task].total)
        self._bar.stop()
        self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


QUIET = Progress(enabled=False)
