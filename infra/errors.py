"""The errors of ``infra``, rooted at one class.

Each says what went wrong and what to do about it; the ``fanout`` command prints the
message (no stack trace) and exits non-zero for any :class:`InfraError`. The errors
of one service live beside it (``BrokerError`` in :mod:`infra.services.broker`,
``CassandraError``, ``JarError``, ``SparkSetupError``, ``ClusterError``,
``StackError``) and subclass :class:`InfraError`; the ones that belong to no single
module live here.
"""

from __future__ import annotations


class InfraError(RuntimeError):
    """A local service or the stack could not do what was asked; the message says why."""


class LoadRunError(InfraError):
    """``fanout load`` could not be carried out (bad flags or target, Locust failed, no results)."""
