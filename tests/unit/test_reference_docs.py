"""The documentation's checks that need no site build: the generated reference pages are
current, the README stays a front door whose links resolve, and CI builds the site.

`make test` also runs `mkdocs build --strict` (a broken link or anchor inside docs/, or a page
left out of the navigation); the README is not part of the site, so its links are checked here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tools import reference_docs

from velocity.settings import PROJECT_ROOT, Settings

REFERENCE = PROJECT_ROOT / "docs" / "reference"
README = PROJECT_ROOT / "README.md"

pytestmark = pytest.mark.timeout(60)


def test_the_committed_reference_pages_are_what_the_code_generates() -> None:
    stale = reference_docs.stale_pages(REFERENCE)
    assert not stale, (
        f"docs/reference/{', '.join(stale)} differ from what the code generates: run "
        f"`.venv/bin/{reference_docs.REGENERATE}` (or `make docs`) and commit the pages"
    )


def test_a_stale_page_is_named_and_write_makes_it_current(tmp_path: Path) -> None:
    assert reference_docs.main(["--write", str(tmp_path)]) == 0
    assert reference_docs.stale_pages(tmp_path) == []
    (tmp_path / "settings.md").write_text("# Settings\n", encoding="utf-8")
    (tmp_path / "metrics.md").unlink()
    assert reference_docs.stale_pages(tmp_path) == ["settings.md", "metrics.md"]
    assert reference_docs.main(["--check", str(tmp_path)]) == 1


def test_every_setting_command_and_metric_is_on_its_page() -> None:
    from velocity.cli.main import build_parser

    pages = reference_docs.generated_pages()
    for name, field in Settings.model_fields.items():
        assert f"`VELOCITY_{name.upper()}`" in pages["settings.md"], name
        assert field.description, f"setting {name} has no description for the reference"
    commands = set(re.findall(r"^#+ `(velocity[^`]*)`$", pages["cli.md"], re.M))
    assert {"velocity stream", "velocity rules apply", "velocity maintain vacuum"} <= commands
    top_level = {f"velocity {name}" for name, _, _ in reference_docs._subcommands(build_parser())}
    assert top_level <= commands
    for metric in (
        "velocity_events_read_total",
        "velocity_alerts_total",
        "velocity_batch_duration_seconds",
        "velocity_kafka_lag_messages",
        "velocity_write_behind_delay_seconds",
        "velocity_heartbeat_timestamp_seconds",
    ):
        assert f"`{metric}`" in pages["metrics.md"], metric


def test_the_pages_do_not_depend_on_this_checkout() -> None:
    """Two machines generate the same bytes: no absolute path of this checkout in them."""
    for name, text in reference_docs.generated_pages().items():
        assert str(PROJECT_ROOT) not in text, name
    assert "`<checkout>/data`" in reference_docs.settings_page()


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; the issue allows 300"


def test_the_readmes_links_resolve() -> None:
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not re.match(r"[a-z]+:", t)]
    assert local, "the README links to the docs"
    missing = [t for t in local if not (README.parent / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"
    # Nothing outside the repository: a clone has only what it holds.
    outside = [t for t in local if not (README.parent / t).resolve().is_relative_to(README.parent)]
    assert not outside, f"README.md links outside the repository: {outside}"


def test_ci_runs_make_test_which_builds_the_docs_strictly() -> None:
    ci = (PROJECT_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line for line in ci.splitlines() if line.strip() and not line.startswith("#")]
    assert commands[-1].strip() == "make test", ci
    makefile = (PROJECT_ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe is not None, "the Makefile has a test target"
    assert "mkdocs build --strict" in recipe.group(1), recipe.group(1)
