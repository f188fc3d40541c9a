"""Settings: flags over the environment over defaults; `fanout` points at its stack without
writing to its own environment; names and defaults come from one place."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infra import cli
from infra.settings import run_dir_views
from infra.stack.stack import AUTH_SECRET_FILE, Stack
from ingest.settings import KafkaSettings
from serving.callers import verify
from serving.settings import ServingSettings
from views.settings import DEFAULT_STORE_URL, STORE_ENV, ViewSettings

SECRET = "s" * 32
NAMES = ("KAFKA_BOOTSTRAP", "FANOUT_STORE", "FANOUT_CHECKPOINT_DIR", "FANOUT_AUTH_SECRET",
         "FANOUT_TIMELINE_CAP", "FANOUT_PARTITIONS", "FANOUT_TOPIC_PREFIX")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)


def test_flags_win_over_the_environment_which_wins_over_defaults():
    environ = {"FANOUT_PARTITIONS": "8", "FANOUT_TOPIC_PREFIX": "t-"}
    kafka = KafkaSettings.from_env(environ, partitions=None, topic_prefix="flag-")
    assert (kafka.partitions, kafka.topic_prefix, kafka.replication) == (8, "flag-", 1)
    assert ViewSettings.from_env({}).store_url == DEFAULT_STORE_URL
    assert ServingSettings.from_env({STORE_ENV: "sqlite:///x"}).store_url == "sqlite:///x"


def test_help_names_the_variable_and_the_default():
    assert ViewSettings.env_help("timeline_cap") == "env FANOUT_TIMELINE_CAP; default 800"
    assert ServingSettings.env_help("access_log") == "env FANOUT_API_ACCESS_LOG; default on"
    assert KafkaSettings.env_help("topic_prefix") == "env FANOUT_TOPIC_PREFIX; default none"


def test_a_run_dir_keeps_the_default_store_and_checkpoint(tmp_path: Path):
    view = run_dir_views(tmp_path, {})
    assert view.store_url == f"sqlite:///{tmp_path / 'fanout.sqlite'}"
    assert view.checkpoint_dir == tmp_path / "checkpoints"
    named = run_dir_views(tmp_path, {STORE_ENV: "cassandra://h/ks"})
    assert named.store_url == "cassandra://h/ks"


def _stack(run: Path) -> Stack:
    run.mkdir()
    (run / AUTH_SECRET_FILE).write_text(SECRET)
    stack = Stack(run_dir=str(run), bootstrap="127.0.0.1:1",
                  store_url=f"sqlite:///{run / 'stack.sqlite'}", api_url="http://127.0.0.1:1")
    stack.save()
    return stack


def test_commands_point_at_the_stack_without_touching_os_environ(tmp_path: Path, capsys):
    run = tmp_path / "run"
    _stack(run)
    before = dict(os.environ)
    assert cli.main(["--run-dir", str(run), "dead-letters"]) == 0
    assert (run / "stack.sqlite").exists(), "dead-letters read the stack's store"
    assert cli.main(["--run-dir", str(run), "token", "42"]) == 0
    token = capsys.readouterr().out.strip().splitlines()[-1]
    assert verify(token, SECRET.encode(), 0) == 42, "token signed with the stack's secret"
    assert dict(os.environ) == before


def test_the_environment_wins_over_the_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    run = tmp_path / "run"
    _stack(run)
    own = tmp_path / "own.sqlite"
    monkeypatch.setenv(STORE_ENV, f"sqlite:///{own}")
    assert cli.main(["--run-dir", str(run), "dead-letters"]) == 0
    assert own.exists() and not (run / "stack.sqlite").exists()


def test_help_of_flags_comes_from_the_settings(capsys):
    with pytest.raises(SystemExit):
        cli.main(["job", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(env FANOUT_TIMELINE_CAP; default 800)" in text
    assert "(env FANOUT_CELEBRITY_THRESHOLD; default 1000)" in text


def test_a_flag_is_made_from_its_field_name_type_description_and_variable():
    import argparse

    parser = argparse.ArgumentParser()
    ServingSettings.add_flags(parser, "port", "access_log", store_url="--store")
    flags = {a.dest: a for a in parser._actions}
    assert flags["port"].option_strings == ["--port"] and flags["port"].type is int
    assert flags["port"].help == ("TCP port of the API (0: any free port). "
                                  "(env FANOUT_API_PORT; default 8080)")
    assert flags["store_url"].option_strings == ["--store"]
    assert flags["access_log"].option_strings == ["--access-log", "--no-access-log"]
    # Not given, a flag is None, and the field falls back to the environment.
    args = parser.parse_args(["--no-access-log", "--port", "9"])
    settings = ServingSettings.from_env({STORE_ENV: "sqlite:///e"}, **vars(args))
    assert (settings.port, settings.access_log, settings.store_url) == (9, False, "sqlite:///e")
    with pytest.raises(SystemExit):
        parser.parse_args(["--port", "nine"])
    ViewSettings.add_flags(parser, "checkpoint_dir", "kafka_source")
    args = parser.parse_args(["--checkpoint-dir", "cp", "--kafka-source", "python"])
    assert (args.checkpoint_dir, args.kafka_source) == (Path("cp"), "python")
    with pytest.raises(SystemExit):
        parser.parse_args(["--kafka-source", "flink"])
    with pytest.raises(TypeError, match="no flag"):
        ServingSettings.add_flags(argparse.ArgumentParser(), "auth_secret")
