"""Where the repository is, for tests that read its files or run its commands.

Test modules sit at different depths under ``tests/``, so none locates the repository
from its own ``__file__``; they take :data:`ROOT` from here.
"""

from __future__ import annotations

from pathlib import Path

#: The repository's root (the directory holding ``pyproject.toml``).
ROOT = Path(__file__).resolve().parents[2]
