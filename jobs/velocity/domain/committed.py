"""Whether the hot state has lost micro-batches known committed elsewhere (pure).

Each store marks how far the stream got, in batch ids:

- the hot state's progress (Redis): the last batch committed there;
- this process's memory: the last batch it committed to the hot state (or found there);
- Delta: the last batch the write-behind appended (each append's transaction version);
- the checkpoint: the last batch Spark counts done.

A batch commits to the hot state first; the write-behind appends it to Delta after that,
and Spark counts it done after that too, except with overlap, where Spark counts a batch
done once its input is spooled, before it commits (the next start decides it from that
input, or finds it committed). So, legitimately:

- the hot state is never behind this process's memory, nor behind Delta, nor behind the
  checkpoint, but for the batches whose input still waits in the input spool;
- the hot state may be ahead of all of them (a crash after its commit: Spark replays the
  batch, which finds itself committed and only finishes the write-behind), or behind the
  batch being replayed (a crash before its commit: the batch is decided again).

Anything else means the hot state lost committed batches while keeping this data dir's
mark: a Redis restored from an older snapshot (yesterday's AOF copied back). Deciding on it
would count against stale windows, cooldowns and de-duplication, so the caller refills it
from Delta instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def known_committed(
    checkpoint: int | None, delta: int | None, undecided: Sequence[int] = ()
) -> int | None:
    """The newest batch known committed outside the hot state (None: none): the newer of
    the checkpoint's and Delta's, below the first of the ``undecided`` batches (those whose
    input waits in the input spool: Spark counted them done before they committed)."""
    marks = [b for b in (checkpoint, delta) if b is not None and b >= 0]
    if not marks:
        return None
    newest = max(marks)
    if undecided:
        newest = min(newest, min(undecided) - 1)
    return newest if newest >= 0 else None


@dataclass(frozen=True)
class Rollback:
    """The hot state is behind a batch known committed."""

    hot: int | None  # the last batch the hot state says it committed (None: none)
    committed: int  # the newest batch known committed
    marks: tuple[tuple[str, int | None], ...]  # each store's mark, for the message

    def message(self, hot_name: str = "Redis") -> str:
        hot = "no batch" if self.hot is None else f"batch {self.hot}"
        marks = ", ".join(f"{name} at batch {b}" for name, b in self.marks if b is not None)
        return (
            f"{hot_name} holds the state as of {hot}, but batch {self.committed} is committed "
            f"({marks}): {hot_name} lost committed batches (restored from an older snapshot?)"
        )


def rolled_back(
    hot: int | None,
    *,
    process: int | None = None,
    checkpoint: int | None = None,
    delta: int | None = None,
    undecided: Sequence[int] = (),
) -> Rollback | None:
    """The rollback when the hot state's progress ``hot`` is behind a batch known committed:
    this ``process``'s last commit, or ``known_committed(checkpoint, delta, undecided)``;
    None when it is not (a replay after a crash is not: see the module docstring)."""
    outside = known_committed(checkpoint, delta, undecided)
    known = max((b for b in (process, outside) if b is not None and b >= 0), default=None)
    if known is None or (hot is not None and hot >= known):
        return None
    marks = (("this process", process), ("the checkpoint", checkpoint), ("Delta", delta))
    return Rollback(hot, known, tuple((n, b) for n, b in marks if b is not None and b >= 0))
