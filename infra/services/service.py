"""What every local service offers the stacks that compose it: start, ready, stop, pid, log.

A *service* is one process fanout starts on this machine and leaves running: a Kafka
node (:class:`~infra.services.broker.KafkaBroker`), a Cassandra node
(:class:`~infra.services.cassandra.LocalCassandra`, and each node of a ring), and the
``fanout`` commands that run as services — the view job, the API, the live verifier, a
job beside (:class:`~infra.services.fanout.FanoutProcess`). The stacks
(:mod:`infra.stack`) start them through this interface and record each one's pid with
its *marker*, a string its command line contains, so that a later ``fanout`` command
finds it again and never takes a recycled pid for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, Self


class Service(Protocol):
    """One local service process."""

    @property
    def pid(self) -> int:
        """Its process id (the leader of its own session); once started."""
        ...

    @property
    def log_path(self) -> Path:
        """The file its output goes to: where a failure's reason is."""
        ...

    @property
    def marker(self) -> str:
        """A string its command line contains, and no other service's does."""
        ...

    def start(self) -> Self:
        """Start it and return once it is ready; on failure, stop what started and raise."""
        ...

    def ready(self) -> bool:
        """Whether it serves now: one probe, no waiting."""
        ...

    def stop(self) -> None:
        """Stop it (SIGTERM, then SIGKILL after a while); a no-op if it is not running."""
        ...
