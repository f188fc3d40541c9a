"""Settings: flags over the environment over defaults; `fanout` points at its stack without
writing to its own environment; names and defaults come from one place."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from infra import cli
from infra.load.run import load_settings, make_plan
from infra.load.settings import LoadSettings
from infra.services.submit import SubmitSettings
from infra.services.submit import main as submit_main
from infra.settings import VerifierSettings, run_dir_views
from infra.stack.stack import AUTH_SECRET_FILE, Stack
from ingest.settings import FanoutSettings, KafkaSettings, SettingsError
from loadgen.settings import LocustSettings
from serving.__main__ import main as serving_main
from serving.callers import verify
from serving.settings import ServingSettings
from views.metrics import JobMetricsSettings
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


def test_a_batch_takes_what_its_store_writes_best_with_unless_the_setting_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("FANOUT_MAX_RECORDS_PER_BATCH", raising=False)
    sqlite = ViewSettings(store_url=f"sqlite:///{tmp_path / 'v.sqlite'}")
    cassandra = ViewSettings(store_url="cassandra://127.0.0.1:1/ks")
    assert sqlite.records_per_batch(sqlite.store()) == 200_000
    assert cassandra.records_per_batch(cassandra.store()) == 1_000_000  # not opened
    monkeypatch.setenv("FANOUT_MAX_RECORDS_PER_BATCH", "3000")
    for view in (ViewSettings(store_url=sqlite.store_url),
                 ViewSettings(store_url=cassandra.store_url)):
        assert view.records_per_batch(view.store()) == 3000


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


def test_add_flags_returns_each_fields_flag_for_what_the_parser_adds():
    parser = argparse.ArgumentParser()
    flags = ServingSettings.add_flags(parser, "port", store_url="--store")
    assert set(flags) == {"port", "store_url"}
    assert flags["store_url"].option_strings == ["--store"] and flags["port"].dest == "port"
    flags["store_url"].metavar = "URL"
    assert "--store URL" in parser.format_help()


# -- fanout load: its settings flags, each over its variable over its default -----------------
#: Each LoadSettings field: (flag value, variable value), each differing from the default.
LOAD_VALUES = {"target": ("http://127.0.0.1:1", "http://127.0.0.1:2"),
               "profile": ("mixed", "read-only"), "duration": ("30", "45"),
               "warmup": ("1", "2"), "rate": ("7", "0"), "users": ("3", "4"),
               "reports": ("flag-reports", "env-reports")}
#: Every flag of `fanout load`, settings or not: none may go missing from its --help.
LOAD_FLAGS = ("--target", "--start", "--profile", "--duration", "--warmup", "--rate", "--users",
              "--arrivals", "--read-mode", "--compare", "--name", "--reports", "--processes",
              "--max-requests", "--allow-remote", "--seed", "--no-probe", "--probe-interval",
              "--probe-authors", "--probe-deadline", "--history-users", "--history-follows",
              "--history-tweets", "--celebrity-threshold", "--auth", "--store", "--keep",
              "--user-range")


@pytest.fixture
def no_load_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LoadSettings.env_names().values():
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("no_load_env")
@pytest.mark.parametrize("field", sorted(LOAD_VALUES))
def test_each_load_flag_falls_back_to_its_variable_then_its_default(field: str):
    assert set(LOAD_VALUES) == set(LoadSettings.model_fields)
    flag, var = LOAD_VALUES[field]
    name = LoadSettings.env_names()[field]
    default = LoadSettings.model_fields[field].default

    def settings(argv: list[str], environ: dict[str, str]) -> LoadSettings:
        args = cli._parser().parse_args(["load", *argv])
        args.environ = environ
        return load_settings(args)

    option = "--" + field.replace("_", "-")
    assert getattr(settings([option, flag], {name: var}), field) == LoadSettings(
        **{field: flag}).model_dump()[field]
    assert getattr(settings([], {name: var}), field) == LoadSettings(**{field: var}).model_dump()[
        field]
    assert getattr(settings([], {}), field) == default


@pytest.mark.usefixtures("no_load_env")
def test_the_load_plan_takes_the_variables_and_a_bad_one_is_named(tmp_path: Path):
    args = cli._parser().parse_args(["load", "--name", "x"])
    args.environ = {"FANOUT_LOAD_RATE": "250", "FANOUT_LOAD_DURATION": "20",
                    "FANOUT_LOAD_WARMUP": "0", "FANOUT_REPORTS_DIR": str(tmp_path),
                    "FANOUT_LOAD_TARGET": "http://127.0.0.1:9"}
    plan = make_plan(args)
    assert (plan.rate, plan.duration, plan.warmup, plan.target) == (250, 20, 0,
                                                                   "http://127.0.0.1:9")
    assert plan.out == tmp_path / "x" and plan.max_requests == 3 * 250 * 20 + 1000
    args.environ = {"FANOUT_LOAD_USERS": "many"}
    with pytest.raises(SettingsError, match=r"FANOUT_LOAD_USERS='many': Input should be a valid"):
        make_plan(args)



def test_a_bad_value_is_named_by_the_flag_or_the_variable_it_came_from(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path):
    monkeypatch.delenv("FANOUT_TIMELINE_CAP", raising=False)
    with pytest.raises(SettingsError, match=r"^bad setting: --broker-retry-s -1: Input should "
                                            r"be greater than or equal to 0$"):
        ViewSettings.from_env({"FANOUT_TIMELINE_CAP": "5"}, broker_retry_s=-1)
    with pytest.raises(SettingsError, match=r"FANOUT_TIMELINE_CAP='abc': Input should be a valid "
                                            r"integer.*; --broker-retry-s -1: "):
        ViewSettings.from_env({"FANOUT_TIMELINE_CAP": "abc"}, broker_retry_s=-1)
    with pytest.raises(SettingsError, match=r"^bad setting: Value error, default_page=9 exceeds "
                                            r"max_page=5$"):  # a check over two fields
        ServingSettings.from_env({"FANOUT_AUTH_SECRET": "s3cr3t-value"}, default_page=9,
                                 max_page=5)
    with pytest.raises(SettingsError) as bad_secret:  # a secret's value is never shown
        ServingSettings.from_env({"FANOUT_AUTH_SECRET": "s3cr3t-value"}, default_page=9,
                                 max_page=5, auth_secret=7)
    assert "s3cr3t" not in str(bad_secret.value) and "--auth-secret '***'" in str(
        bad_secret.value)
    monkeypatch.setenv("FANOUT_TIMELINE_CAP", "abc")  # read from the process, not given
    with pytest.raises(SettingsError, match=r"FANOUT_TIMELINE_CAP='abc': Input should be"):
        ViewSettings.from_env({})
    assert cli.main(["--run-dir", str(tmp_path), "schema", "status"]) == 2
    assert "fanout schema: bad setting: FANOUT_TIMELINE_CAP='abc'" in caplog.text
    assert submit_main() == 2  # the job on a cluster (spark-submit)
    assert "bad setting: FANOUT_TIMELINE_CAP='abc'" in caplog.text.rsplit("fanout schema", 1)[1]
    monkeypatch.setenv("FANOUT_API_PORT", "x")
    with pytest.raises(SystemExit, match=r"^python -m serving: bad setting: FANOUT_API_PORT='x'"):
        serving_main([])


@pytest.mark.parametrize("settings", [KafkaSettings, ViewSettings, ServingSettings,
                                      VerifierSettings, SubmitSettings, JobMetricsSettings,
                                      LoadSettings, LocustSettings], ids=lambda c: c.__name__)
def test_settings_read_each_fields_variable_and_not_its_name(
        settings: type[FanoutSettings], monkeypatch: pytest.MonkeyPatch):
    # pydantic-settings' own source reads a field's name too, in any case: PORT, HOST or
    # WORKERS, which hosting platforms set, would have set the API's.
    variables = settings.env_names()
    for variable in variables.values():
        monkeypatch.delenv(variable, raising=False)
    before = settings().model_dump()
    for name in settings.model_fields:
        for spelled in {name, name.upper()} - set(variables.values()):
            monkeypatch.setenv(spelled, "7")
    assert settings().model_dump() == before
    assert settings.from_env({}).model_dump() == before
    field, variable = next(iter(variables.items()))
    was = before[field]
    value = (str(not was).lower() if isinstance(was, bool)
             else "7" if isinstance(was, int | float) else "x")
    monkeypatch.setenv(variable, value)  # its variable, by its exact name, is read
    assert settings().model_dump()[field] != before[field]


def test_the_help_of_fanout_load_lists_every_flag_and_names_each_variable(capsys):
    with pytest.raises(SystemExit):
        cli.main(["load", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag in LOAD_FLAGS:
        assert f" {flag} " in text, flag
    for field in LoadSettings.model_fields:
        assert f"({LoadSettings.env_help(field)})" in text, field
    assert "(env FANOUT_LOAD_DURATION; default 60)" in text
    assert "(env FANOUT_REPORTS_DIR; default reports)" in text
    assert "--target URL " in text
