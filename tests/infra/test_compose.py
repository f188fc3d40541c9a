"""``infra/compose.yaml`` kept honest without a container engine.

No Docker runs here, so the file is parsed (PyYAML, merge keys resolved as Compose
does) and checked against the code: the services exist and depend on services that
exist, in ways Compose accepts; every variable handed to a fanout process is one the
code reads (a typo would be silently ignored by pydantic-settings); the values that
must agree across services agree; the paths the commands name exist in the image.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

import pytest
import yaml

from infra.load.settings import LoadSettings
from infra.services.submit import SubmitSettings
from ingest.settings import KafkaSettings
from loadgen.settings import LocustSettings
from serving.settings import ServingSettings
from tests.support.paths import ROOT
from views.settings import ViewSettings
from views.stores.cassandra.config import parse_url

COMPOSE = ROOT / "infra" / "compose.yaml"
SERVICES = {"kafka", "cassandra", "topics", "schema", "spark-master", "spark-worker",
            "view-job", "api", "locust-master", "locust-worker"}
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
#: Spark's own variables, read by its launch scripts and by PySpark.
SPARK_VARS = {"SPARK_MASTER", "SPARK_WORKER_DIR", "PYSPARK_PYTHON"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def env(service: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in (service.get("environment") or {}).items()}


def command(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command") or []
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


def fanout_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in services.items() if s.get("image", "").startswith("fanout:")}


def known_variables() -> set[str]:
    """Every environment variable fanout's code reads."""
    names: set[str] = set()
    for settings in (KafkaSettings, ViewSettings, ServingSettings, SubmitSettings,
                     LoadSettings, LocustSettings):
        names.update(settings.env_names().values())
    sources = [*ROOT.joinpath("infra").rglob("*.py"), ROOT / "loadgen" / "locustfile.py"]
    for path in sources:
        names.update(re.findall(r"\b((?:FANOUT|LOCUST_FANOUT)_[A-Z_]+)\b", path.read_text()))
    return names | {"KAFKA_BOOTSTRAP"} | SPARK_VARS


# -- structure -----------------------------------------------------------------------------

def test_the_file_parses_and_has_every_piece(compose: dict[str, Any],
                                             services: dict[str, dict[str, Any]]) -> None:
    assert SERVICES <= set(services)
    assert set(compose["volumes"]) >= {"checkpoints", "kafka-data", "cassandra-data"}


def test_every_service_names_its_image(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        assert service.get("image"), name
        assert ":" in service["image"], f"{name}: pin a tag"


def test_the_app_image_builds_from_files_that_exist(services: dict[str, dict[str, Any]]) -> None:
    for name, service in fanout_services(services).items():
        build = service["build"]
        context = (COMPOSE.parent / build["context"]).resolve()
        assert context == ROOT, name
        assert (context / build["dockerfile"]).is_file(), name
    dockerfile = (ROOT / "infra" / "docker" / "Dockerfile").read_text()
    for package in ("ingest", "views", "serving", "loadgen", "infra"):
        assert f"COPY {package} ./{package}" in dockerfile
    assert "openjdk-17" in dockerfile  # Spark 4 needs Java 17+


def test_dependencies_exist_and_use_valid_conditions(
        services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        depends = service.get("depends_on") or {}
        if isinstance(depends, list):
            depends = {d: {"condition": "service_started"} for d in depends}
        for target, spec in depends.items():
            assert target in services, f"{name} depends on unknown {target}"
            condition = spec.get("condition", "service_started")
            assert condition in CONDITIONS, f"{name} -> {target}: {condition}"
            if condition == "service_healthy":
                assert "healthcheck" in services[target], f"{target} has no healthcheck"
            if condition == "service_completed_successfully":
                assert services[target].get("restart", "no") == "no", f"{target} restarts"


def test_no_host_networking_and_no_port_clashes(services: dict[str, dict[str, Any]]) -> None:
    published = []
    for name, service in services.items():
        assert service.get("network_mode") != "host", name
        assert not service.get("privileged"), name
        published += [str(p).split(":")[0] for p in service.get("ports", [])]
    assert len(published) == len(set(published))


def test_named_volumes_are_declared(compose: dict[str, Any],
                                    services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        for mount in service.get("volumes", []):
            source = str(mount).split(":")[0]
            if not source.startswith((".", "/")):
                assert source in compose["volumes"], f"{name}: {source}"


# -- configuration ---------------------------------------------------------------------------

def test_every_fanout_variable_is_one_the_code_reads(
        services: dict[str, dict[str, Any]]) -> None:
    known = known_variables()
    for name, service in fanout_services(services).items():
        unknown = {k for k in env(service) if k not in known}
        assert not unknown, f"{name} sets variables nothing reads: {sorted(unknown)}"


@pytest.mark.parametrize(("service", "needed"), [
    ("topics", {"KAFKA_BOOTSTRAP", "FANOUT_PARTITIONS"}),
    ("schema", {"FANOUT_STORE"}),
    ("view-job", {"KAFKA_BOOTSTRAP", "FANOUT_PARTITIONS", "FANOUT_STORE", "SPARK_MASTER",
                  "FANOUT_CHECKPOINT_DIR", "FANOUT_DRIVER_HOST", "FANOUT_TIMELINE_CAP"}),
    ("api", {"KAFKA_BOOTSTRAP", "FANOUT_PARTITIONS", "FANOUT_STORE", "FANOUT_API_HOST",
             "FANOUT_API_PORT", "FANOUT_AUTH_SECRET", "FANOUT_TIMELINE_CAP"}),
    ("locust-master", {"LOCUST_FANOUT_AUTH_SECRET"}),
    ("locust-worker", {"LOCUST_FANOUT_AUTH_SECRET"}),
])
def test_each_process_gets_what_it_needs(services: dict[str, dict[str, Any]], service: str,
                                         needed: set[str]) -> None:
    assert needed <= set(env(services[service])), sorted(needed - set(env(services[service])))


def test_shared_settings_agree(services: dict[str, dict[str, Any]]) -> None:
    for key in ("FANOUT_STORE", "FANOUT_PARTITIONS", "KAFKA_BOOTSTRAP", "FANOUT_TIMELINE_CAP"):
        values = {env(services[s]).get(key) for s in ("view-job", "api")}
        assert len(values) == 1, key
    assert env(services["schema"])["FANOUT_STORE"] == env(services["api"])["FANOUT_STORE"]
    assert env(services["topics"])["FANOUT_PARTITIONS"] == env(services["api"])[
        "FANOUT_PARTITIONS"]
    secret = env(services["api"])["FANOUT_AUTH_SECRET"]
    for locust in ("locust-master", "locust-worker"):
        assert env(services[locust])["LOCUST_FANOUT_AUTH_SECRET"] == secret


def test_the_store_and_broker_point_at_services(services: dict[str, dict[str, Any]]) -> None:
    config = parse_url(env(services["api"])["FANOUT_STORE"])
    assert set(config.hosts) <= set(services) and config.keyspace == "fanout"
    host, port = env(services["api"])["KAFKA_BOOTSTRAP"].split(":")
    advertised = env(services[host])["KAFKA_ADVERTISED_LISTENERS"]
    assert f"//{host}:{port}" in advertised
    assert env(services["api"])["FANOUT_API_HOST"] == "0.0.0.0"  # noqa: S104


def test_the_job_is_submitted_to_the_spark_master(services: dict[str, dict[str, Any]]) -> None:
    job = services["view-job"]
    cmd = command(job)
    assert cmd[0] == "spark-submit"
    master = cmd[cmd.index("--master") + 1]
    assert master == env(job)["SPARK_MASTER"] == "spark://spark-master:7077"
    assert cmd[-1] == "/app/infra/services/submit.py" and (ROOT / "infra" / "services" / "submit.py").is_file()
    assert env(job)["FANOUT_DRIVER_HOST"] == job["hostname"]
    spark_master = command(services["spark-master"])
    assert spark_master[spark_master.index("--port") + 1] == "7077"
    assert master in command(services["spark-worker"])


def test_executors_share_the_checkpoint_volume(services: dict[str, dict[str, Any]]) -> None:
    where = env(services["view-job"])["FANOUT_CHECKPOINT_DIR"]
    for name in ("view-job", "spark-worker"):
        assert f"checkpoints:{where}" in services[name]["volumes"], name


def test_locust_runs_the_locustfile_against_the_api(services: dict[str, dict[str, Any]]) -> None:
    master, worker = command(services["locust-master"]), command(services["locust-worker"])
    for cmd in (master, worker):
        path = cmd[cmd.index("-f") + 1]
        assert (ROOT / path.removeprefix("/app/")).is_file()
    assert "--master" in master and "--worker" in worker
    assert worker[worker.index("--master-host") + 1] == "locust-master"
    port = env(services["api"])["FANOUT_API_PORT"]
    assert master[master.index("--host") + 1] == f"http://api:{port}"


def test_the_one_shot_steps_run_fanout_code(services: dict[str, dict[str, Any]]) -> None:
    assert command(services["schema"])[:3] == ["fanout", "schema", "apply"]
    assert "create_topics(KafkaSettings())" in " ".join(command(services["topics"]))
    assert command(services["api"]) == ["fanout", "serve"]


def test_submit_settings_override_the_loopback_driver() -> None:
    conf = SubmitSettings(master="spark://m:7077", driver_host="view-job").spark_conf()
    assert conf == {"spark.driver.host": "view-job", "spark.driver.bindAddress": "0.0.0.0"}
