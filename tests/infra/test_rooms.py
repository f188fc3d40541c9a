"""``infra``'s rooms and the order they stand in: every import goes down, none goes up.

``infra`` is laid out by role (``docs/design.md`` §1): the local services, the faults
on their network, the stacks composed of them, the checks of a running stack, the
view operations, and the commands on top. A room may use the rooms below it and
never one above, so the drawing in the design stays true and no import cycle can run
between two rooms. Imports inside functions count: they are cycles all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import ROOT

INFRA = ROOT / "infra"

#: Bottom to top. A module's room is its subpackage, or the module itself at the top.
ROOMS = (
    ("infra.errors", "infra.settings", "infra.webclient"),
    ("infra.services",),
    ("infra.faults",),
    ("infra.stack",),
    ("infra.checks",),
    ("infra.ops",),
    ("infra.demo",),
    ("infra.load",),
    ("infra.cli",),
)


def _level(module: str) -> int:
    for level, names in enumerate(ROOMS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return level
    msg = f"{module} is in no room of ROOMS: give it one"
    raise AssertionError(msg)


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The ``infra`` modules a file imports, at any depth (functions included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("infra.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "infra":
                found |= {f"infra.{a.name}" for a in node.names}
            elif node.module.startswith("infra."):
                found.add(node.module)
    return found


def test_every_import_in_infra_goes_to_its_own_room_or_one_below() -> None:
    upward = []
    for path in sorted(INFRA.rglob("*.py")):
        module = _module(path)
        for target in _imports(path):
            if _level(target) > _level(module):
                upward.append(f"{module} -> {target}")
    assert upward == []


def test_the_rooms_are_the_packages_on_disk() -> None:
    rooms = {n for names in ROOMS for n in names}
    on_disk = {f"infra.{p.name}" for p in INFRA.iterdir() if (p / "__init__.py").is_file()}
    on_disk |= {f"infra.{p.stem}" for p in INFRA.glob("*.py") if p.stem != "__init__"}
    assert on_disk == rooms


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from infra.checks.verify import verify\n")
    assert _imports(source) == {"infra.checks.verify"}
    assert _level("infra.checks.verify") > _level("infra.services.broker")
