"""Access control: tokens, 401/403 on every route, auth off, the secret at startup.

Over real HTTP. Refusals happen before anything is produced, so most tests run the
app against an unreachable broker; the ones that must get past auth to a 202 use
the session's Kafka node.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from infra import cli as infra_cli
from infra.stack.launch import _auth_secret
from infra.stack.stack import AUTH_SECRET_FILE, Stack
from ingest.events import Post
from ingest.settings import KafkaSettings
from serving.app import create_app
from serving.callers import mint, verify
from serving.errors import ConfigError, Unauthorized
from serving.settings import ServingSettings
from tests.support.api import (
    SECRET,
    assert_error,
    bearer,
    open_store,
    read_record,
    serve,
    settings,
    unreachable_kafka,
)
from tests.support.paths import ROOT

ME, OTHER = 42, 43
KEY = SECRET.encode()
WRITES = [("POST", "/v1/tweets", {"text": "hi"}),
          ("POST", "/v1/tweets", {"text": "re", "in_reply_to": "99"}),
          ("DELETE", "/v1/tweets/99", None),
          ("POST", "/v1/tweets/99/reposts", None),
          ("DELETE", "/v1/reposts/99", None),
          ("DELETE", f"/v1/users/{ME}", None),
          *[(method, f"/v1/users/{ME}/{edge}/{OTHER}", None)
            for edge in ("following", "blocks", "mutes") for method in ("PUT", "DELETE")]]
HOME = f"/v1/users/{ME}/home"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    store = open_store(tmp_path_factory.mktemp("auth"))
    with serve(settings(store, write_timeout_ms=300), store, unreachable_kafka()) as c:
        yield c
    store.close()


def _call(client: httpx.Client, method: str, path: str, body: object,
          headers: dict[str, str]) -> httpx.Response:
    return client.request(method, path, json=body, headers=headers)


# -- tokens -----------------------------------------------------------------------------
def test_mint_then_verify_round_trips_at_the_edges():
    assert verify(mint(2**63 - 1, KEY, 60, now=1000), KEY, now=1059.9) == 2**63 - 1
    assert verify(mint(1, KEY, 1, now=1000), KEY, now=1000) == 1


@pytest.mark.parametrize("now", [1060, 1060.5, 10**10])
def test_expired_token_is_refused(now: float):
    with pytest.raises(Unauthorized, match="expired"):
        verify(mint(ME, KEY, 60, now=1000), KEY, now=now)


def _tampered(now: float) -> dict[str, str]:
    """Bad tokens by what is wrong with them, minted at ``now``."""
    good = mint(ME, KEY, 60, now=now)
    version, payload, mac = good.split(".")
    other_payload = mint(OTHER, KEY, 60, now=now).split(".")[1]
    flipped = mac[:-2] + ("A" if mac[-2] != "A" else "B") + mac[-1]
    return {"another user, same signature": f"{version}.{other_payload}.{mac}",
            "signature altered": f"{version}.{payload}.{flipped}",
            "another key": mint(ME, b"another-secret-0123456789", 60, now=now),
            "unknown version": f"f2.{payload}.{mac}", "no signature": f"{version}.{payload}",
            "a fourth part": f"{version}.{payload}.{mac}.x", "no payload": f"{version}..{mac}",
            "empty signature": f"{version}.{payload}.", "empty": "", "Bearer": "Bearer",
            "not ascii": "é" * 10, "long": "x" * 500,
            "payload not base64": f"{version}.{payload}!.{mac}"}


# Named, not listed by value: a token's bytes hold the time it was minted, and the
# suite's workers must collect the same test ids (tests/plugins/workers.py).
@pytest.mark.parametrize("kind", list(_tampered(0)))
def test_tampered_or_malformed_token_is_refused(kind: str):
    now = time.time()
    with pytest.raises(Unauthorized):
        verify(_tampered(now)[kind], KEY, now=now)


def test_mint_refuses_bad_input():
    with pytest.raises(ValueError, match="user id"):
        mint(0, KEY, 60)
    with pytest.raises(ValueError, match="ttl"):
        mint(1, KEY, 0)


# -- 401 and 403 on every route -----------------------------------------------------------
@pytest.mark.parametrize(("method", "path", "body"), [*WRITES, ("GET", HOME, None)])
@pytest.mark.parametrize("case", ["missing", "not bearer", "garbage", "expired", "tampered",
                                  "other key"])
def test_no_valid_token_is_401(guarded: httpx.Client, method: str, path: str, body: object,
                               case: str):
    token = mint(ME, KEY, 60)
    headers = {
        "missing": {},
        "not bearer": {"Authorization": f"Basic {token}"},
        "garbage": {"Authorization": "Bearer not-a-token"},
        "expired": bearer(ME, ttl=60, now=time.time() - 61),
        "tampered": {"Authorization": f"Bearer {_tampered(time.time())['another user, same signature']}"},
        "other key": bearer(ME, secret="another-secret-0123456789"),
    }[case]
    response = _call(guarded, method, path, body, headers)
    assert assert_error(response, 401)["error"] == "unauthorized"
    assert response.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize(("method", "path"), [
    *[(method, f"/v1/users/{OTHER}/{edge}/7")
      for edge in ("following", "blocks", "mutes") for method in ("PUT", "DELETE")],
    ("DELETE", f"/v1/users/{OTHER}"), ("GET", f"/v1/users/{OTHER}/home")])
def test_acting_for_another_user_is_403(guarded: httpx.Client, method: str, path: str):
    body = assert_error(guarded.request(method, path, headers=bearer(ME)), 403)
    assert (body["error"], body["field"]) == ("forbidden", "user_id")


def test_own_home_with_token_and_public_author_tweets(guarded: httpx.Client):
    assert guarded.get(HOME, headers=bearer(ME)).status_code == 200
    assert guarded.get(f"/v1/users/{OTHER}/tweets").status_code == 200
    assert guarded.get(f"/v1/users/{OTHER}/tweets", headers=bearer(ME)).status_code == 200


def test_auth_checked_before_the_id_is_parsed_and_id_before_ownership(guarded: httpx.Client):
    assert_error(guarded.get("/v1/users/abc/home"), 401)
    assert assert_error(guarded.get("/v1/users/abc/home", headers=bearer(ME)),
                        400)["field"] == "user_id"


@pytest.mark.broker
def test_valid_token_writes_as_its_user(tmp_path: Path, kafka_settings: KafkaSettings):
    store = open_store(tmp_path)
    with serve(settings(store), store, kafka_settings) as client:
        response = client.post("/v1/tweets", json={"text": "as me"}, headers=bearer(ME))
    store.close()
    assert response.status_code == 202, response.text
    _, event = read_record(kafka_settings, response.json()["token"])
    assert isinstance(event, Post) and event.author_id == ME


# -- auth off -----------------------------------------------------------------------------
@pytest.mark.broker
def test_auth_off_trusts_the_request(tmp_path: Path, kafka_settings: KafkaSettings):
    store = open_store(tmp_path)
    with serve(settings(store, auth=False, auth_secret=None), store, kafka_settings) as client:
        home = client.get(f"/v1/users/{OTHER}/home")
        by_header = client.post("/v1/tweets", json={"text": "x"}, headers={"X-User-Id": "7"})
        by_token = client.post("/v1/tweets", json={"text": "y"},
                               headers=bearer(8, secret="unchecked-secret-0123"))
        by_path = client.put(f"/v1/users/{OTHER}/following/{ME}")
        nobody = client.post("/v1/tweets", json={"text": "z"})
        bad_header = client.post("/v1/tweets", json={"text": "z"}, headers={"X-User-Id": "0"})
    store.close()
    assert home.status_code == 200
    authors = [read_record(kafka_settings, r.json()["token"])[1] for r in (by_header, by_token)]
    assert [a.author_id for a in authors if isinstance(a, Post)] == [7, 8]
    assert by_path.status_code == 202
    assert_error(nobody, 401)
    assert assert_error(bad_header, 400)["field"] == "X-User-Id"


# -- the secret ---------------------------------------------------------------------------
@pytest.mark.parametrize("secret", [None, "", "short"])
def test_auth_on_without_a_usable_secret_fails_at_startup(secret: str | None):
    with pytest.raises(ConfigError, match="FANOUT_AUTH_SECRET"):
        create_app(ServingSettings(auth=True, auth_secret=secret))
    create_app(ServingSettings(auth=False, auth_secret=secret))  # off: no secret needed


def test_settings_read_auth_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FANOUT_AUTH", "off")
    monkeypatch.setenv("FANOUT_AUTH_SECRET", SECRET)
    monkeypatch.setenv("FANOUT_TOKEN_TTL_S", "120")
    s = ServingSettings()
    assert (s.auth, s.secret(), s.token_ttl_s) == (False, KEY, 120)
    assert SECRET not in repr(s)


def test_fanout_token_prints_a_verifiable_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]):
    monkeypatch.setenv("FANOUT_AUTH_SECRET", SECRET)
    assert infra_cli.main(["--run-dir", str(tmp_path), "token", str(ME), "--ttl", "30"]) == 0
    token = capsys.readouterr().out.strip()
    assert verify(token, KEY, time.time()) == ME
    with pytest.raises(Unauthorized, match="expired"):
        verify(token, KEY, time.time() + 31)
    assert infra_cli.main(["--run-dir", str(tmp_path), "token", "abc"]) == 2
    monkeypatch.delenv("FANOUT_AUTH_SECRET")
    assert infra_cli.main(["--run-dir", str(tmp_path), "token", "5"]) == 2
    assert "FANOUT_AUTH_SECRET" in capsys.readouterr().err


def test_up_generates_a_private_secret_that_the_stack_env_carries(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("FANOUT_AUTH_SECRET", raising=False)
    _auth_secret(tmp_path, os.environ)
    path = tmp_path / AUTH_SECRET_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    stack = Stack(run_dir=str(tmp_path), bootstrap="b:1", store_url="sqlite:///x",
                  api_url="http://127.0.0.1:1")
    secret = stack.env()["FANOUT_AUTH_SECRET"]
    assert len(secret) == 64 and secret == path.read_text()
    assert ServingSettings(auth_secret=secret).secret() == secret.encode()
    _auth_secret(tmp_path, os.environ)
    assert path.read_text() == secret  # one per run directory: tokens outlive down/up
    monkeypatch.setenv("FANOUT_AUTH_SECRET", SECRET)
    _auth_secret(tmp_path, os.environ)  # the environment's wins; no stale file left behind
    assert not path.exists() and "FANOUT_AUTH_SECRET" not in stack.env()
    assert os.environ["FANOUT_AUTH_SECRET"] == SECRET


def test_serve_exits_2_before_listening_without_a_secret(monkeypatch: pytest.MonkeyPatch):
    from serving.app import serve

    monkeypatch.delenv("FANOUT_AUTH_SECRET", raising=False)
    with pytest.raises(SystemExit) as exited:
        serve(ServingSettings(auth=True, port=0))
    assert exited.value.code == 2


def test_a_fanout_command_imports_no_web_framework() -> None:
    # Every `fanout` command imports infra.cli; the checkers mint tokens and name headers
    # through serving.callers. FastAPI in that import cost each command ~0.2 s of CPU.
    shown = subprocess.run(
        [sys.executable, "-c", "import sys, infra.cli; "
         "print(sorted(m for m in sys.modules if m.split('.')[0] in ('fastapi', 'starlette')))"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert shown.stdout.strip() == "[]", shown.stdout
