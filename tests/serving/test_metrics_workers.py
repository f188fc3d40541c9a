"""Several API workers on one port answer ``/metrics`` as one.

``python -m serving --workers 2`` runs as ``fanout up`` starts the API: forked
workers sharing the port. Reads land on either worker (a new connection each), and
every scrape — answered by either — must count all of them: requests and page-cache
reads summed over both workers, the store's figures once, the batch-log histogram
fed by one worker only. Each worker's own share is read from its file in the
multiprocess directory, to show that both served and the sum spans them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from prometheus_client import values
from prometheus_client.multiprocess import MultiProcessCollector

from infra import webclient
from serving import workers
from serving.metrics import MULTIPROC_DIR_ENV, shared_dir, worker_exited
from tests.support.api import closed_port, open_store
from tests.support.metrics import HOME, batch, scrape, value

pytestmark = pytest.mark.timeout(180)
READS = 40
COUNT = "fanout_http_request_duration_seconds_count"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """Two API workers on a store with three logged batches; (base URL, process, TMPDIR)."""
    store = open_store(tmp_path)
    now_ms = int(time.time() * 1000)
    for batch_id in range(3):
        batch(store, batch_id, now_ms - 60_000 + batch_id * 1000, dead=2)
    store.close()
    tmp, port = tmp_path / "tmp", closed_port()
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FANOUT_", "KAFKA_", "PROMETHEUS_"))}
    env |= {"TMPDIR": str(tmp), "FANOUT_AUTH": "off", "FANOUT_API_ACCESS_LOG": "false"}
    with (tmp_path / "api.log").open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "serving", "--workers", "2", "--port", str(port),
             "--store", f"sqlite:///{store.path}"], env=env, stdout=out, stderr=out)
    base = f"http://127.0.0.1:{port}"
    try:
        _await_health(base, process, tmp_path / "api.log")
        yield base, process, tmp
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(30)


def _await_health(base: str, process: subprocess.Popen[bytes], log: Path) -> None:
    """Until the API answers and both workers listen: a worker binds its own socket once
    its app is built, and reads made before that would all go to the other."""
    deadline = time.monotonic() + 60
    port = int(base.rsplit(":", 1)[1])
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the API exited: {log.read_text()[-2000:]}"
        try:
            if (webclient.get(f"{base}/healthz", timeout=2).status_code == 200
                    and _listening(process, port) == 2):
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    pytest.fail(f"the API at {base} did not answer /healthz from two workers within 60s")


def _listening(process: subprocess.Popen[bytes], port: int) -> int:
    """How many of the API's workers hold a socket listening on ``port``."""
    count = 0
    for child in psutil.Process(process.pid).children():
        try:
            count += any(c.status == psutil.CONN_LISTEN and c.laddr.port == port
                         for c in child.net_connections(kind="tcp"))
        except psutil.Error:
            pass
    return count


def _fresh_scrape(base: str) -> dict[str, Any]:
    with webclient.client(base_url=base, timeout=10) as client:  # a new connection each time
        return scrape(client)


def _page_reads(families: dict[str, Any]) -> float:
    reads = families["fanout_page_cache_reads"]
    return sum(value(reads, "fanout_page_cache_reads_total", outcome=o) for o in ("hit", "miss"))


def _own_shares(tmp: Path) -> dict[int, float]:
    """Each worker's own count of home reads, from its histogram file."""
    shares = {}
    for path in tmp.glob("fanout-api-metrics-*/histogram_*.db"):
        pid = int(path.stem.rsplit("_", 1)[1])
        samples = [s for m in MultiProcessCollector.merge([str(path)]) for s in m.samples]
        shares[pid] = sum(s.value for s in samples if s.name == COUNT
                          and s.labels.get("route") == HOME and s.labels.get("status") == "200")
    return shares


def _settled(families: dict[str, Any]) -> bool:
    """Every worker's page-cache reads copied, and the batch log's histogram fed."""
    fed = [s.value for s in families.get("fanout_view_batch_apply_seconds", [])
           if s.name == "fanout_view_batch_apply_seconds_count"]
    return _page_reads(families) >= READS and sum(fed) >= 3


def test_every_scrape_counts_every_worker(api):
    base, process, tmp = api
    for user in range(READS):
        assert webclient.get(f"{base}/v1/users/{user + 1}/home", timeout=10).status_code == 200
    deadline = time.monotonic() + 15  # other workers copy their page-cache counts each second
    while not _settled(_fresh_scrape(base)):
        assert time.monotonic() < deadline, "every worker's page-cache reads and the batch " \
            "log's 3 batches within 15s"
        time.sleep(0.2)
    for _ in range(10):
        families = _fresh_scrape(base)
        assert value(families["fanout_http_request_duration_seconds"], COUNT, method="GET",
                     route=HOME, status="200") == READS
        assert _page_reads(families) == READS
        # Read from the store by the answering worker: once, not once per worker.
        assert value(families["fanout_dead_letters"], "fanout_dead_letters_total") == 6
        assert value(families["fanout_store_up"], "fanout_store_up") == 1
        # Fed by one worker from the batch log: the same count whoever answers.
        assert value(families["fanout_view_batch_apply_seconds"],
                     "fanout_view_batch_apply_seconds_count") == 3
    shares = _own_shares(tmp)
    workers_now = {c.pid for c in psutil.Process(process.pid).children()}
    assert set(shares) == workers_now and len(workers_now) == 2, (shares, workers_now)
    assert all(share > 0 for share in shares.values()) and sum(shares.values()) == READS


def test_stopping_the_api_removes_its_metrics_directory(api):
    _base, process, tmp = api
    assert len(list(tmp.glob("fanout-api-metrics-*"))) == 1
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    assert not list(tmp.glob("fanout-api-metrics-*"))


def _supervise_two_workers() -> int:
    """Fork two workers (one exits 0, one 3), supervise them; 0 if as expected, else why."""
    children = {}
    for index, code in enumerate((0, 3)):
        pid = os.fork()
        if pid == 0:
            os._exit(code)
        children[pid] = index
    seen: list[int] = []
    if workers._supervise(dict(children), on_exit=seen.append) != 1:  # one died on its own
        return 2
    return 0 if sorted(seen) == sorted(children) else 3


def test_the_supervisor_reports_every_worker_that_exits(monkeypatch):
    # The supervisor's os.wait() reaps any child of its process. The API's supervisor has
    # only its workers; this pytest process may have others (the session's servers, an
    # exited helper not yet reaped), so the supervisor runs in a process of its own.
    monkeypatch.setattr(signal, "signal", lambda *_: None)  # keep pytest's own handlers
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = _supervise_two_workers()
        finally:
            os._exit(code)
    _, raw = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(raw)
    assert code != 2, "the supervisor did not exit 1 when a worker died on its own"
    assert code != 3, "the supervisor did not report each worker's exit exactly"
    assert code == 0, f"the supervising process exited {code}"


def test_a_dead_workers_live_gauges_go_and_its_counts_stay(tmp_path):
    for name in ("gauge_livesum_41.db", "gauge_all_41.db", "counter_41.db",
                 "gauge_livesum_42.db"):
        (tmp_path / name).write_bytes(b"")
    worker_exited(tmp_path, 41)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "counter_41.db", "gauge_all_41.db", "gauge_livesum_42.db"]


def test_the_shared_directory_lives_for_one_start():
    kept, before = values.ValueClass, os.environ.get(MULTIPROC_DIR_ENV)
    with shared_dir() as path:
        assert path.is_dir() and os.environ[MULTIPROC_DIR_ENV] == str(path)
        assert values.ValueClass._multiprocess  # what metrics built now (in workers) use
    assert not path.exists()
    assert values.ValueClass is kept and os.environ.get(MULTIPROC_DIR_ENV) == before
