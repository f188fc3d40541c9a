"""Schemathesis against the running API's own ``/openapi.json`` (bad HTTP input).

Every operation of the schema is driven with generated requests — valid ones
(positive) and, where an operation takes input, ones that break the schema
(negative) — over real HTTP to uvicorn with auth on and the session's embedded
broker behind the write routes. Each request carries a valid bearer token for the
user it acts for (the path's ``user_id`` when that is a valid id), so generation
reaches past auth into the handlers; auth itself is tested in tests/serving/test_auth.py.

Asserted: no 5xx; every 4xx is JSON with ``error`` and ``message``; and
schemathesis's own checks (status codes and bodies conform to the schema, invalid
data is rejected, valid data accepted). "Valid data accepted" is waived for the
kinds of request the schema cannot tell from valid ones: those carrying an opaque
token (``after``, ``cursor``: any string fits, only issued ones are valid), a follow,
block or mute of oneself (a rule across two parameters), and a reply to an id out of
range (``in_reply_to`` is a decimal string, whose range [1, 2^63-1] no pattern
states). Bounded: ``MAX_EXAMPLES`` per
operation and mode, a 30 s timeout a request, no shrinking; no per-example deadline,
since a write's first request connects the app's producer to a broker that a busy
box may keep waiting for seconds. The number of examples run is printed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from schemathesis import GenerationMode
from schemathesis.generation.case import Case
from schemathesis.specs.openapi.checks import positive_data_acceptance

from ingest.events import MAX_ID
from ingest.settings import KafkaSettings
from serving.app import create_app
from serving.settings import ServingSettings
from tests.support.api import bearer, open_store, running, settings
from views.delta import Delta
from views.stores.sqlite import SQLiteStore

#: Examples per operation and mode. Each is a request over HTTP validated against the
#: schema, about 50 ms of the test process's CPU beside the other worker; Hypothesis
#: draws new ones on every run (no example database), so runs add to each other.
MAX_EXAMPLES = 50
FALLBACK_USER = 42
#: Opaque tokens: any string fits their schema, only ones the API issued are valid.
OPAQUE = frozenset({"after", "cursor", "since"})
COUNTS: dict[str, int] = {}


def _operations() -> list[tuple[str, str]]:
    """(method, path) of every operation, from the schema of an app built offline.

    Not the live stream's (``text/event-stream``): a valid request never ends, so a
    generated one cannot be awaited; ``tests/serving/test_stream.py`` drives its input.
    """
    spec = create_app(ServingSettings(auth=False)).openapi()
    return [(method.upper(), path) for path, ops in spec["paths"].items()
            for method, op in ops.items()
            if "text/event-stream" not in op.get("responses", {}).get("200", {}).get(
                "content", {})]


def _fill(store: SQLiteStore) -> None:
    """A few users, tweets and timelines, so reads have something to hydrate."""
    t0 = 1_700_000_000_000
    deltas = [Delta.profile(u, t0, f"u{u}", f"U {u}") for u in (1, 2, FALLBACK_USER)]
    for i in range(30):
        author, tweet = 1 + i % 2, 1000 + i
        deltas += [Delta.tweet(tweet, author, t0 + i, f"tweet {i}"),
                   Delta.timeline_add(FALLBACK_USER, tweet, author, t0 + i)]
    store.apply(deltas)


@pytest.fixture
def api(tmp_path: Path, kafka_settings: KafkaSettings) -> Iterator[str]:
    store = open_store(tmp_path)
    _fill(store)
    config = settings(store, after_timeout_ms=200, max_page=50, default_page=10,
                      write_timeout_ms=20_000)  # a busy broker is not a 5xx to find
    with running(create_app(config, store, kafka=kafka_settings)) as base:
        yield base
    store.close()


def _acting_user(case: Case) -> int:
    raw = (case.path_parameters or {}).get("user_id")
    text = str(raw) if raw is not None else ""
    if text.isascii() and text.isdigit() and len(text) <= 20 and 1 <= int(text) <= MAX_ID:
        return int(text)
    return FALLBACK_USER


def _check(case: Case, response: schemathesis.Response) -> None:
    status = response.status_code
    assert status < 500, f"{status} for {case.as_curl_command()}: {response.text[:300]}"
    if 400 <= status < 500:
        content_type = (response.headers.get("content-type") or [""])[0]
        assert content_type.startswith("application/json"), case.as_curl_command()
        body = response.json()
        assert isinstance(body.get("error"), str) and body["error"], body
        assert isinstance(body.get("message"), str) and body["message"], body


def _beyond_the_schema(case: Case) -> bool:
    """Schema-valid yet rightly refused (400): an opaque token, an edge to oneself, a
    reply to an id out of range."""
    path = case.path_parameters or {}
    self_edge = "other_id" in path and str(path.get("user_id")) == str(path["other_id"])
    body = case.body if isinstance(case.body, dict) else {}
    reply_to = body.get("in_reply_to")
    bad_reply = isinstance(reply_to, str) and not (
        reply_to.isascii() and reply_to.isdigit() and 1 <= int(reply_to) <= MAX_ID)
    return bool(OPAQUE & set(case.query or {})) or self_edge or bad_reply


def _fuzz(base: str, operation: schemathesis.APIOperation, mode: GenerationMode) -> int:
    ran = 0

    @hypothesis_settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
                         phases=[Phase.explicit, Phase.reuse, Phase.generate],
                         suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Case) -> None:
        nonlocal ran
        ran += 1
        headers = bearer(_acting_user(case))
        response = case.call(base_url=base, headers=headers, timeout=30)
        _check(case, response)
        exempt = [positive_data_acceptance] if _beyond_the_schema(case) else None
        case.validate_response(response, headers=headers, excluded_checks=exempt)

    run()
    return ran


@pytest.mark.broker
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("method", "path"), _operations())
def test_schema_fuzz(api: str, method: str, path: str, capsys: pytest.CaptureFixture[str]):
    # Auth is not fuzzed here (tests/serving/test_auth.py covers it): every request carries a
    # valid token, so a "negative" case never differs from a positive one by auth only.
    config = schemathesis.Config()
    config.projects.get_default().generation.update(with_security_parameters=False)
    schema = schemathesis.openapi.from_url(f"{api}/openapi.json", config=config)
    operation = schema[path][method]
    started = time.monotonic()
    takes_input = any(map(len, (operation.path_parameters, operation.query, operation.body)))
    modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if takes_input else [])
    ran = {mode.value: _fuzz(api, operation, mode) for mode in modes}
    COUNTS[f"{method} {path}"] = sum(ran.values())
    with capsys.disabled():
        print(f"\nschemathesis {method} {path}: {ran} examples in "
              f"{time.monotonic() - started:.1f}s; {sum(COUNTS.values())} so far")
    assert sum(ran.values()) > 0
