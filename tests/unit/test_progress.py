"""Progress on stderr: drawn with the step, events done of the total and the rate on a
terminal; nothing at all otherwise."""

from __future__ import annotations

import io

from velocity.generate import GenerateOptions, generate_events
from velocity.operating.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_quiet_when_stderr_is_not_a_terminal() -> None:
    stream = io.StringIO()
    with Progress(stream=stream) as progress:
        assert not progress.enabled
        progress.step("parse", 100)
        progress.update(50)
    assert stream.getvalue() == ""


def test_a_terminal_sees_the_step_the_events_done_and_the_rate() -> None:
    stream = Terminal()
    with Progress(stream=stream) as progress:
        assert progress.enabled
        progress.step("parse+quarantine", 1000)
        progress.update(400)
        progress.step("evaluate+alerts")  # the total carries over
        progress.update(1000)
    shown = stream.getvalue()
    assert "parse+quarantine" in shown and "evaluate+alerts" in shown
    assert "1000/1000" in shown
    assert "events/s" in shown


def test_generate_reports_the_lines_written(tmp_path) -> None:
    heard: list[int] = []
    options = GenerateOptions(events=20_000, files=3, seed=3)
    generate_events(tmp_path, options, on_lines=heard.append)
    assert heard == sorted(heard) and heard[-1] == 20_000
    lines = sum(len(p.read_text().splitlines()) for p in tmp_path.glob("*.jsonl"))
    assert lines == 20_000
