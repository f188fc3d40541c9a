"""A start that loses a port it was given runs again on others (infra.services.ports)."""

from __future__ import annotations

import pytest

from infra.services.ports import PortTaken, on_other_ports


def test_a_start_that_loses_a_port_runs_again_numbered_until_it_binds() -> None:
    seen: list[int] = []

    def start(attempt: int) -> str:
        seen.append(attempt)
        if attempt < 3:
            raise PortTaken("taken")
        return "up"

    undone: list[int] = []
    assert on_other_ports(start, 3, "a service", lost=lambda: RuntimeError("lost"),
                          undo=lambda: undone.append(1)) == "up"
    assert seen == [1, 2, 3] and undone == []


def test_a_port_lost_at_every_start_undoes_it_and_says_what_to_do() -> None:
    seen: list[int] = []

    def start(attempt: int) -> None:
        seen.append(attempt)
        raise PortTaken("taken")

    undone: list[int] = []
    with pytest.raises(RuntimeError, match="lost a port at every start"):
        on_other_ports(start, 3, "a service",
                       lost=lambda: RuntimeError("lost a port at every start"),
                       undo=lambda: undone.append(1))
    assert seen == [1, 2, 3] and undone == [1]


def test_any_other_failure_at_start_is_undone_and_raised_at_once() -> None:
    seen: list[int] = []

    def start(attempt: int) -> None:
        seen.append(attempt)
        raise ValueError("bad config")

    undone: list[int] = []
    with pytest.raises(ValueError, match="bad config"):
        on_other_ports(start, 3, "a service", lost=lambda: RuntimeError("lost"),
                       undo=lambda: undone.append(1))
    assert seen == [1] and undone == [1]
