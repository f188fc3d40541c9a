"""``fanout down`` stops every service once, each no later than what it uses
(``infra.stack.stack.DOWN_STEPS``); the whole-stack tests check that nothing is left."""

from __future__ import annotations

import itertools

from infra.stack.stack import DOWN_STEPS, SERVICES


def test_down_stops_every_service_once_and_none_before_what_started_after_it():
    steps = [name for step in DOWN_STEPS for name in step]
    assert sorted(steps) == sorted(SERVICES) and len(set(steps)) == len(steps)
    step_of = {name: i for i, step in enumerate(DOWN_STEPS) for name in step}
    for first, then in itertools.combinations(SERVICES, 2):  # SERVICES: the order `up` starts
        assert step_of[then] <= step_of[first], f"{first} stops before {then}, which uses it"
