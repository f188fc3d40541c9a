"""The Grafana dashboard and the Prometheus config ask only for what the stack exports.

Neither Prometheus nor Grafana runs here (no container engine), so the files are
checked against the code: every PromQL expression of ``infra/grafana/fanout.json``
names only series that a running API (scraped over HTTP) or the view job's exporter
(fed a progress report, its batch log and log ends) exports — or the two the live
verifier exports, listed here by name. The scrape config, the provisioning and the
compose file must point at the same services, ports, paths and data source.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.api import bearer, open_store, serve, settings, unreachable_kafka
from tests.support.dashboard import DASHBOARD, FROM_THE_VERIFIER, INFRA, metric_names, walk_panels
from tests.support.job_metrics import KAFKA, logged, progress
from tests.support.metrics import batch
from views.metrics import DEFAULT_JOB_METRICS_PORT, JobMetrics

#: What the dashboard must show (write and read rates, read and post -> visible
#: percentiles, offsets behind, batch duration, divergence).
SHOWN = {"fanout_write_requests_total", "fanout_http_request_duration_seconds_count",
         "fanout_http_request_duration_seconds_bucket", "fanout_job_freshness_seconds_bucket",
         "fanout_job_offsets_behind", "fanout_job_batch_duration_seconds_bucket",
         "fanout_verify_divergent", "fanout_verify_checked"}


def test_the_tokenizer_finds_series_not_functions_labels_or_windows():
    expr = ('histogram_quantile(0.99, sum by (le) (rate(a_bucket{route="/v/{id}/x",'
            ' le=~"1|2"}[$__rate_interval]))) / on(job) group_left clamp_min(b_total, 1)'
            ' + c offset 5m')
    assert metric_names(expr) == {"a_bucket", "b_total", "c"}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def expressions(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in walk_panels(dashboard["panels"]) for t in p.get("targets", [])]
    assert exprs
    return exprs


def _names(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.fixture(scope="module")
def api_series(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Every series a scrape of the API shows once it has served reads and writes."""
    store = open_store(tmp_path_factory.mktemp("dashboard"))
    batch(store, 0, int(time.time() * 1000), dead=1)
    with serve(settings(store, write_timeout_ms=300), store, unreachable_kafka()) as client:
        assert client.get("/v1/users/5/home", headers=bearer(5)).status_code == 200
        assert client.get("/v1/users/5/tweets").status_code == 200
        assert client.put("/v1/users/5/following/7", headers=bearer(5)).status_code == 503
        text = client.get("/metrics").text
    store.close()
    return _names(text)


@pytest.fixture(scope="module")
def job_series() -> set[str]:
    """Every series the view job's exporter shows once a batch has run."""
    metrics = JobMetrics(KAFKA)
    metrics.progress(progress())
    metrics.batches([logged(1, 10, 400)])
    metrics.log_ends({("cap_tweets", 0): 140})
    metrics.dead_letters(0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    return _names(generate_latest(registry).decode())


def test_every_expression_names_only_exported_series(expressions, api_series, job_series):
    exported = api_series | job_series | FROM_THE_VERIFIER
    for expr in expressions:
        unknown = metric_names(expr) - exported
        assert not unknown, f"{expr!r} asks for series nothing exports: {sorted(unknown)}"


def test_the_dashboard_shows_what_an_operator_needs(expressions):
    asked = set().union(*(metric_names(e) for e in expressions))
    assert asked >= SHOWN, sorted(SHOWN - asked)


def test_panels_read_the_provisioned_data_source(dashboard):
    source = yaml.safe_load((INFRA / "grafana" / "datasource.yml").read_text())["datasources"][0]
    assert source["url"] == "http://prometheus:9090"
    for panel in walk_panels(dashboard["panels"]):
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == source["uid"], panel["title"]
            assert all(t["datasource"]["uid"] == source["uid"] for t in panel["targets"])
    ids = [p["id"] for p in walk_panels(dashboard["panels"])]
    assert len(ids) == len(set(ids))


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((INFRA / "compose.yaml").read_text())["services"]


def test_prometheus_scrapes_the_api_and_the_job_where_they_listen(compose):
    config = yaml.safe_load((INFRA / "prometheus.yml").read_text())
    targets = {job["job_name"]: job["static_configs"][0]["targets"]
               for job in config["scrape_configs"]}
    api_port = int(compose["api"]["environment"]["FANOUT_API_PORT"])
    verifier_port = int(compose["verifier"]["environment"]["FANOUT_VERIFIER_PORT"])
    assert targets == {"api": [f"api:{api_port}"],
                       "view-job": [f"view-job:{DEFAULT_JOB_METRICS_PORT}"],
                       "verifier": [f"verifier:{verifier_port}"]}
    assert {"api", "view-job", "verifier"} <= set(compose)
    assert compose["verifier"]["environment"]["FANOUT_VERIFIER_HOST"] == "0.0.0.0"
    # The job's driver binds every interface there, so Prometheus reaches its endpoint.
    assert "spark-submit" in compose["view-job"]["command"]


def _mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> file in the repository, for the service's bind mounts."""
    out = {}
    for mount in service.get("volumes", []):
        source, target = str(mount).split(":")[:2]
        if source.startswith("."):
            out[target] = (INFRA / source).resolve()
    return out


def test_compose_mounts_the_config_and_the_provisioning(compose):
    prometheus = _mounts(compose["prometheus"])
    assert prometheus == {"/etc/prometheus/prometheus.yml": INFRA / "prometheus.yml"}
    assert "--config.file=/etc/prometheus/prometheus.yml" in compose["prometheus"]["command"]
    grafana = _mounts(compose["grafana"])
    assert all(path.is_file() for path in grafana.values())
    provider = yaml.safe_load((INFRA / "grafana" / "dashboards.yml").read_text())["providers"][0]
    dashboards = {t for t, p in grafana.items() if p == DASHBOARD}
    assert {str(Path(t).parent) for t in dashboards} == {provider["options"]["path"]}
    assert any(t.startswith("/etc/grafana/provisioning/datasources/") for t in grafana)
    assert any(t.startswith("/etc/grafana/provisioning/dashboards/") for t in grafana)
    assert compose["grafana"]["depends_on"] == ["prometheus"]


def test_the_verifier_exports_them():
    from infra.checks.verifier import VerifierMetrics

    assert _names(generate_latest(VerifierMetrics().registry).decode()) >= FROM_THE_VERIFIER
