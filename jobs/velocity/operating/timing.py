"""Where a job's time goes: named steps, each the seconds since the previous mark."""

from __future__ import annotations

import time
from collections.abc import Callable


class StepTimer:
    """``mark(name)`` records the seconds since the previous mark (or the start) under name;
    a name marked twice adds up."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._started = self._last = clock()
        self.steps: dict[str, float] = {}

    def mark(self, name: str) -> None:
        now = self._clock()
        self.steps[name] = round(self.steps.get(name, 0.0) + now - self._last, 3)
        self._last = now

    @property
    def total(self) -> float:
        return self._clock() - self._started
