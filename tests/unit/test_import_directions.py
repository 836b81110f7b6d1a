"""Imports point the ways the module map (docs/architecture/modules.md) allows, read from
the code's own imports (every ``import`` and ``from … import``, at module level or inside
a function, ``TYPE_CHECKING`` ones too): a module that reaches across a layer fails here,
naming the module, the line and the rule it breaks."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "jobs" / "velocity"

# Each layer of jobs/velocity/ and the layers it may import (itself included where listed).
# ``settings`` names the Redis keys through ``redis.keys``, the layout's pure module.
PURE = {"domain", "engine", "analyst", "operating", "errors", "generate", "resources"}
MAY_IMPORT: dict[str, set[str]] = {
    "errors": set(),
    "resources": set(),
    "domain": {"domain", "errors"},
    "generate": {"domain", "errors"},
    "engine": {"engine", "domain", "errors"},
    "analyst": {"analyst", "engine", "domain", "errors"},
    "operating": {"operating", "domain", "errors", "settings"},
    "settings": {"domain", "errors", "redis.keys"},
    "redis": {"redis", "operating", "engine", "domain", "errors", "settings"},
    "kafka": {"kafka", "operating", "domain", "errors", "settings"},
    "delta": {"delta", "analyst", "operating", "engine", "domain", "errors", "settings"},
    "quality": {"quality", "delta", "redis", "spark", "engine", "domain", "errors", "settings"},
    # The HTTP door of the check: over redis/'s check, never the jobs or the stores' writers.
    "serving": {"serving", "redis", "operating", "domain", "errors", "settings"},
    "spark": {
        "spark",
        "delta",
        "redis",
        "kafka",
        "analyst",
        "operating",
        "engine",
        "domain",
        "errors",
        "settings",
        "resources",
    },
    "cli": {
        "cli",
        "spark",
        "delta",
        "redis",
        "kafka",
        "quality",
        "serving",
        "analyst",
        "operating",
        "engine",
        "domain",
        "errors",
        "settings",
        "generate",
        "resources",
    },
}
# The map's deliberate crossing, module to module, with its reason.
CROSSINGS = {
    # One reading of compacted hours for every reader of the buckets table.
    ("velocity.delta.live", "velocity.spark.evaluate"),
}
# Libraries each layer may use besides the standard library and Velocity itself.
LIBRARIES: dict[str, set[str]] = {
    "errors": set(),
    "resources": set(),
    "domain": set(),
    "generate": set(),
    "engine": {"numpy", "pyarrow"},
    "analyst": {"numpy", "pyarrow"},
    "operating": {"prometheus_client", "pyarrow", "rich"},
    "settings": {"pydantic", "pydantic_settings"},
    "redis": {"redis", "numpy", "pyarrow"},
    "kafka": {"confluent_kafka"},
    "delta": {"deltalake", "arro3", "delta", "pyspark", "pyarrow", "numpy"},
    "quality": {"great_expectations", "delta", "pyspark", "pyarrow"},
    "serving": {"starlette", "uvicorn", "prometheus_client", "redis"},
}
# Nothing in jobs/ knows Airflow or the plugins; the plugins never import a DAG.
NEVER_IN_JOBS = {"airflow", "velocity_airflow", "dags", "fastapi"}


class Import(NamedTuple):
    module: str  # the importing module, dotted
    line: int
    target: str  # the imported module, dotted (absolute)


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, root: Path) -> Iterator[Import]:
    """Every import of the file at ``path`` (under ``root``, the folder on sys.path)."""
    module = _module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                # ``from velocity.domain import rules`` imports the module velocity.domain.rules.
                as_module = f"{base}.{alias.name}"
                yield Import(module, node.lineno, as_module if _is_module(as_module) else base)


def _is_module(dotted: str) -> bool:
    if not dotted.startswith("velocity."):
        return False
    path = PACKAGE.joinpath(*dotted.split(".")[1:])
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def layer_of(dotted: str) -> str:
    """velocity.X.… → X for a subpackage X, else the top-level module's name."""
    parts = dotted.split(".")
    if len(parts) == 1:
        return ""
    return parts[1]


def _allowed(importer: str, target: str) -> bool:
    layer, wanted = layer_of(importer), layer_of(target)
    if (importer, target) in CROSSINGS:
        return True
    allowed = MAY_IMPORT[layer]
    return wanted in allowed or target in {f"velocity.{a}" for a in allowed if "." in a}


def velocity_imports() -> list[Import]:
    return [
        found for path in sorted(PACKAGE.rglob("*.py")) for found in imports_of(path, ROOT / "jobs")
    ]


def test_every_layer_of_jobs_is_in_the_map() -> None:
    layers = {layer_of(_module_name(p, ROOT / "jobs")) for p in PACKAGE.rglob("*.py")}
    assert layers - {""} <= set(MAY_IMPORT), "a new layer: add it to the map and to MAY_IMPORT"


def test_velocity_imports_point_the_ways_the_map_allows() -> None:
    wrong = [
        f"{i.module}:{i.line} imports {i.target}: {layer_of(i.module)} may import only "
        f"{sorted(MAY_IMPORT[layer_of(i.module)])}"
        for i in velocity_imports()
        if i.target.startswith("velocity.")
        and layer_of(i.module)
        and not _allowed(i.module, i.target)
    ]
    assert not wrong, "\n".join(wrong)


def test_each_layer_uses_only_its_libraries() -> None:
    std = set(sys.stdlib_module_names) | {"__future__"}
    wrong = []
    for i in velocity_imports():
        top, layer = i.target.split(".")[0], layer_of(i.module)
        if top in std or top == "velocity" or layer not in LIBRARIES:
            continue
        if top not in LIBRARIES[layer]:
            wrong.append(f"{i.module}:{i.line} imports {i.target}: {layer} may use "
                         f"{sorted(LIBRARIES[layer]) or 'the standard library only'}")  # fmt: skip
    assert not wrong, "\n".join(wrong)


def test_the_pure_core_imports_no_edge() -> None:
    edges = {"pyspark", "delta", "deltalake", "redis", "airflow", "confluent_kafka",
             "great_expectations", "fastapi"}  # fmt: skip
    wrong = [
        f"{i.module}:{i.line} imports {i.target}"
        for i in velocity_imports()
        if layer_of(i.module) in PURE and i.target.split(".")[0] in edges
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(
    ("folder", "root", "forbidden"),
    [
        ("jobs/velocity", "jobs", NEVER_IN_JOBS),
        ("plugins", "plugins", {"dags"}),
    ],
)
def test_imports_point_from_dags_to_plugins_to_jobs(
    folder: str, root: str, forbidden: set[str]
) -> None:
    wrong = [
        f"{i.module}:{i.line} imports {i.target}"
        for path in sorted((ROOT / folder).rglob("*.py"))
        for i in imports_of(path, ROOT / root)
        if i.target.split(".")[0] in forbidden
    ]
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_a_crossing(tmp_path: Path) -> None:
    """The rules can fail: a domain module importing Redis's owner, or the engine a Spark
    job, is refused; a lazy import inside a function, and a relative one, are seen too."""
    assert not _allowed("velocity.domain.rules", "velocity.redis.mirror")
    assert not _allowed("velocity.engine.kernel", "velocity.spark.evaluate")
    assert not _allowed("velocity.delta.reader", "velocity.spark.evaluate")
    assert _allowed("velocity.delta.live", "velocity.spark.evaluate")
    assert _allowed("velocity.settings", "velocity.redis.keys")
    assert not _allowed("velocity.settings", "velocity.redis.mirror")
    probe = tmp_path / "velocity" / "domain" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text(
        "def f():\n    from velocity.spark import stream\n    from ..redis import keys\n"
    )
    found = list(imports_of(probe, tmp_path))
    assert found == [
        Import("velocity.domain.probe", 2, "velocity.spark.stream"),
        Import("velocity.domain.probe", 3, "velocity.redis.keys"),
    ]
    assert not any(_allowed(i.module, i.target) for i in found)


def test_the_module_map_shows_the_tree() -> None:
    """docs/architecture/modules.md names every folder of jobs/velocity/ and every module
    in it (a command group's module excepted: the map names their pattern)."""
    text = (ROOT / "docs" / "architecture" / "modules.md").read_text(encoding="utf-8")
    folders = {p.parent for p in PACKAGE.rglob("__init__.py")} - {PACKAGE}
    missing = [f"{f.relative_to(PACKAGE)}/" for f in sorted(folders) if f"{f.name}/" not in text]
    missing += [
        str(p.relative_to(PACKAGE))
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.name not in {"__init__.py", "__main__.py"}
        and p.parent.name != "commands"
        and f"`{p.name}`" not in text
        and f"{p.name}" not in text
    ]
    assert not missing, f"the module map does not name: {missing}"
