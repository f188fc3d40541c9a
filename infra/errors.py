"""The errors of ``infra``, rooted at one class.

Each says what went wrong and what to do about it; the ``fanout`` command prints the
message (no stack trace) and exits non-zero for any :class:`InfraError`.
"""

from __future__ import annotations


class InfraError(RuntimeError):
    """A local service or the stack could not do what was asked; the message says why."""
