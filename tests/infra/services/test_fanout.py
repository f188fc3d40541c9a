"""A ``fanout`` command run as a service: started until ready, found by its marker, stopped.

The API (``fanout serve``) on a SQLite store stands for every such service (the job,
the verifier and a job beside are started the same way, by a ready file): a real
process, on a free loopback port.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.services.fanout import FanoutProcess, ServiceError, alive
from tests.support.api import closed_port, open_store

pytestmark = pytest.mark.timeout(120)


def _api(tmp_path: Path, **kwargs: object) -> FanoutProcess:
    store = open_store(tmp_path)
    store.close()
    port = closed_port()
    env = {"FANOUT_STORE": f"sqlite:///{store.path}", "FANOUT_API_HOST": "127.0.0.1",
           "FANOUT_API_PORT": str(port), "FANOUT_AUTH": "off", "FANOUT_API_WORKERS": "1"}
    return FanoutProcess(tmp_path, "serve", env, health=f"http://127.0.0.1:{port}/healthz",
                         what="the API", **kwargs)  # type: ignore[arg-type]


def test_a_started_service_is_ready_and_found_by_its_marker_until_stopped(
        tmp_path: Path) -> None:
    api = _api(tmp_path).start()
    pid = api.pid
    try:
        assert api.ready() and alive(pid, api.marker)
        assert api.log_path == tmp_path / "logs" / "serve.log"
        assert api.log_path.stat().st_size > 0
    finally:
        api.stop()
    assert not alive(pid, api.marker) and not api.ready()


def test_a_start_given_up_stops_what_it_started_and_says_why(tmp_path: Path) -> None:
    api = _api(tmp_path, watch=lambda: "the broker (pid 1) died")
    with pytest.raises(ServiceError, match=r"the broker \(pid 1\) died while waiting for the API"):
        api.start()
    assert not alive(api.pid, api.marker)


def test_a_service_is_ready_by_a_file_or_by_a_url_not_both(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ready file or by a health URL"):
        FanoutProcess(tmp_path, "job", {})
    with pytest.raises(ValueError, match="ready file or by a health URL"):
        FanoutProcess(tmp_path, "job", {}, ready_file=tmp_path / "r", health="http://x/")


def test_services_spawned_side_by_side_are_each_awaited_after(tmp_path: Path) -> None:
    """``fanout up`` spawns the job, starts the API and the verifier, then awaits the job."""
    first, second = (tmp_path / "first", tmp_path / "second")
    first.mkdir(), second.mkdir()
    services = [_api(first), _api(second)]
    for service in services:
        service.spawn()
    try:
        assert [s.await_ready() for s in services] == services
        assert all(s.ready() for s in services)
    finally:
        for service in services:
            service.stop()


def test_a_service_that_exits_while_awaited_names_its_log(tmp_path: Path) -> None:
    api = _api(tmp_path)
    api.env = {**api.env, "FANOUT_STORE": "nosuchstore://anywhere"}
    api.spawn()
    with pytest.raises(ServiceError, match=r"the API exited before it was ready; see its log "
                                           r".*serve\.log"):
        api.await_ready()
    assert "nosuchstore" in api.log_path.read_text()
