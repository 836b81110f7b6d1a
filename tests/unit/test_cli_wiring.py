"""The `velocity` parser's wiring (velocity.cli.main): every command names a handler that
exists in its group's module, and building the parser imports no command module (each is
imported when its command runs)."""

from __future__ import annotations

import argparse
import inspect
import subprocess
import sys
from collections.abc import Iterator

from velocity.cli.main import LazyHandler, build_parser


def _commands(
    parser: argparse.ArgumentParser, words: tuple[str, ...] = ()
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(``velocity …`` words, parser) of every command that runs something."""
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subcommands:
        yield " ".join(words), parser
    for action in subcommands:
        for name, sub in action.choices.items():
            yield from _commands(sub, (*words, name))


def test_every_command_has_a_handler_in_its_group_module() -> None:
    commands = dict(_commands(build_parser()))
    assert {"up", "rules list", "rules pause", "stream-stop", "maintain vacuum"} <= set(commands)
    for words, parser in commands.items():
        run = parser.get_default("run")
        assert isinstance(run, LazyHandler), words
        handler = run.handler()
        assert inspect.isfunction(handler), words
        assert handler.__module__ == f"velocity.cli.commands.{run.group}", words
        assert list(inspect.signature(handler).parameters) == ["args"], words


def test_building_the_parser_imports_no_command_module_and_no_spark() -> None:
    code = (
        "import sys; from velocity.cli.main import build_parser; build_parser().format_help(); "
        "print(sorted(m for m in sys.modules if m.startswith('velocity.cli.commands.') "
        "or m.split('.')[0] in ('pyspark', 'py4j', 'pandas', 'deltalake')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "[]"
