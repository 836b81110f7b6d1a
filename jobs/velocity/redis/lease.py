"""A held state lock, as its writes see it: the lock's key and token (every write is fenced
with them) and whether the lease was lost. Taken by ``velocity.redis.lock``; ``cluster``
and ``mirror`` only carry it into their fenced writes."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from velocity.errors import VelocityError


class StateLockLost(VelocityError):
    """The holder's lease ran out (it stalled past it) and someone else may hold the lock:
    the holder must not write."""


@dataclass
class Lease:
    """A held state lock: its key and token (writes are fenced with them) and whether the
    lease was lost (a renewal found the lock gone or someone else's)."""

    name: str
    token: str
    holder: str
    lost: threading.Event = field(default_factory=threading.Event)
    acquired: float = field(default_factory=time.monotonic)
    released: float | None = None

    def held_seconds(self) -> float:
        """How long the lock was (or, inside the block, has been) held."""
        return (time.monotonic() if self.released is None else self.released) - self.acquired

    def check(self) -> None:
        """Raise ``StateLockLost`` when the lease is gone: call before each write."""
        if self.lost.is_set():
            raise StateLockLost(
                f"{self.holder} lost the state lock {self.name} (its lease ran out); "
                "its writes stop here and the job fails so that it starts again cleanly"
            )
