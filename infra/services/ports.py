"""A service start tried again on other ports when one it was given is taken first.

Kafka, Cassandra and Spark's master are given free ports (:func:`~infra.services.process.free_port`)
and bind them seconds later, when their JVM is up; another process can take one in
between. Their starts go through :func:`on_other_ports`, with the one retry policy
(tenacity) of a service start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final, TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt

from infra.errors import InfraError

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: Starts a service tries, each on other free ports, before it gives up.
PORT_ATTEMPTS: Final = 3


class PortTaken(InfraError):
    """A service lost a port it was given to another process before it could bind it."""


def on_other_ports(start: Callable[[int], _T], attempts: int, what: str, *,
                   lost: Callable[[], Exception], undo: Callable[[], object] = lambda: None,
                   ) -> _T:
    """``start(attempt)``, run again while it raises :class:`PortTaken`: ``attempts`` at most.

    A port found free can be taken before the JVM binds it. ``start`` picks its ports
    (other ones from attempt 2), spawns the service and waits for it, and raises
    :class:`PortTaken` when the service's log says a port was taken. When the start
    fails for good, ``undo`` stops what it started; after the last port lost, the
    error ``lost()`` makes is raised (saying what to do), any other failure as it is.
    """
    def say(state: RetryCallState) -> None:
        log.warning("%s found a port taken at start (attempt %d of %d); trying other ports",
                    what, state.attempt_number, attempts)

    policy = Retrying(stop=stop_after_attempt(attempts), reraise=True, before_sleep=say,
                      retry=retry_if_exception_type(PortTaken))
    try:
        return policy(lambda: start(policy.statistics["attempt_number"]))
    except PortTaken:
        undo()
        raise lost() from None
    except BaseException:
        undo()
        raise
