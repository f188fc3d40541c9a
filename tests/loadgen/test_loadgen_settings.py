"""The locustfile's settings: each ``--fanout-*`` flag over its ``LOCUST_FANOUT_*`` variable
over its default, on Locust's own parser; and ``fanout load`` handing a Locust child its
workload in those variables.

Locust is imported in a subprocess only (see ``test_loadgen.py`` for why).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.cli import _parser
from infra.load.prep import Prepared
from infra.load.run import locust_command, locust_env, make_plan
from loadgen.settings import SECRET_FIELD, LocustSettings
from tests.support.paths import ROOT

#: Each field: (flag value, variable value), each differing from the other and the default.
VALUES = {"fanout_users": ("5-9", "10-20"), "fanout_workload": ("f.json", "e.json"),
          "fanout_profile": ("mixed", "read-only"), "fanout_rate": ("7", "3"),
          "fanout_arrivals": ("constant", "poisson"), "fanout_think": ("0.5", "0.25"),
          "fanout_warmup": ("2", "4"), "fanout_tokens": ("f-tokens.json", "e-tokens.json"),
          SECRET_FIELD: ("f" * 16, "e" * 16), "fanout_out": ("/f", "/e"),
          "fanout_interval": ("2", "5"), "fanout_max_requests": ("9", "99"),
          "fanout_seed": ("1", "2"), "fanout_streams": ("3", "4"),
          "fanout_stream_limit": ("5", "6"), "fanout_stream_hold": ("7", "8"),
          "fanout_stream_away": ("0.5", "1.5"), "fanout_celebrities": ("1,2", "3")}

#: Run in a child: Locust's parser with the locustfile's flags; the settings of three
#: invocations (every flag given, none given, none given with no variable set) and of
#: the web UI's blank secret, and what the parser shows.
_PARSE = """
import json, os, sys
from loadgen import locustfile
from locust.argument_parser import get_parser

flags, environ = json.loads(sys.argv[1]), json.loads(sys.argv[2])
parser = get_parser()
argv = [a for field, value in flags.items() for a in ("--" + field.replace("_", "-"), value)]
os.environ.update(environ)
out = {"flags": locustfile.settings_of(parser.parse_args(argv)).model_dump(),
       "variables": locustfile.settings_of(parser.parse_args([])).model_dump()}
blank = parser.parse_args([])
blank.fanout_auth_secret = ""  # what the web UI's form sends for a field left blank
out["blank_secret"] = locustfile.settings_of(blank).fanout_auth_secret
for name in environ:
    del os.environ[name]
out["defaults"] = locustfile.settings_of(parser.parse_args([])).model_dump()
out["help"] = " ".join(parser.format_help().split())
out["web_ui"] = sorted(parser.args_included_in_web_ui)
out["secret"] = sorted(parser.secret_args_included_in_web_ui)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def parsed() -> dict:
    assert set(VALUES) == set(LocustSettings.model_fields)
    names = LocustSettings.env_names()
    flags = {field: flag for field, (flag, _) in VALUES.items()}
    environ = {names[field]: var for field, (_, var) in VALUES.items()}
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCUST_")}
    done = subprocess.run([sys.executable, "-c", _PARSE, json.dumps(flags), json.dumps(environ)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                          check=True)
    return json.loads(done.stdout.splitlines()[-1])


def _typed(values: dict[str, str]) -> dict:
    return LocustSettings(**values).model_dump()


def test_each_flag_wins_over_its_variable_which_wins_over_its_default(parsed: dict):
    assert parsed["flags"] == _typed({f: flag for f, (flag, _) in VALUES.items()})
    assert parsed["variables"] == _typed({f: var for f, (_, var) in VALUES.items()})
    defaults = {f: info.default for f, info in LocustSettings.model_fields.items()}
    assert parsed["defaults"] == _typed(defaults)
    for field, value in parsed["flags"].items():  # no field is its default by chance
        assert value != parsed["variables"][field] != parsed["defaults"][field], field


def test_a_blank_secret_from_the_web_ui_leaves_the_variable(parsed: dict):
    assert parsed["blank_secret"] == VALUES[SECRET_FIELD][1]


def test_the_parser_lists_every_flag_with_its_variable_and_masks_the_secret(parsed: dict):
    for field in LocustSettings.model_fields:
        assert "--" + field.replace("_", "-") + " " in parsed["help"], field
        assert f"({LocustSettings.env_help(field)})" in parsed["help"], field
    assert "(env LOCUST_FANOUT_STREAM_HOLD; default 60)" in parsed["help"]
    assert SECRET_FIELD in parsed["web_ui"] and parsed["secret"] == [SECRET_FIELD]


def test_the_settings_read_only_their_own_variables(monkeypatch: pytest.MonkeyPatch):
    # The API's secret is FANOUT_AUTH_SECRET: not the locustfile's fanout_auth_secret.
    for name in LocustSettings.env_names().values():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FANOUT_AUTH_SECRET", "s" * 32)
    monkeypatch.setenv("FANOUT_SEED", "5")
    settings = LocustSettings.from_env({})
    assert (settings.fanout_auth_secret, settings.fanout_seed) == ("", 0)


def test_fanout_load_hands_locust_its_plan_in_the_variables(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch):
    for name in LocustSettings.env_names().values():
        monkeypatch.delenv(name, raising=False)
    args = _parser().parse_args(["load", "--reports", str(tmp_path), "--name", "x",
                                 "--profile", "mixed", "--rate", "250", "--duration", "3600",
                                 "--warmup", "5", "--arrivals", "poisson", "--seed", "9",
                                 "--max-requests", "77"])
    plan = make_plan(args)
    out, workload, tokens = tmp_path / "out", tmp_path / "w.json", tmp_path / "t.json"
    env = locust_env(plan, Prepared(workload, tokens, [], True, 10), out)
    assert set(env) <= set(LocustSettings.env_names().values())
    got = LocustSettings.from_env(env)
    assert (got.fanout_out, got.fanout_workload, got.fanout_tokens) == (str(out), str(workload),
                                                                         str(tokens))
    assert (got.fanout_profile, got.fanout_rate, got.fanout_arrivals) == ("mixed", 250, "poisson")
    assert (got.fanout_warmup, got.fanout_interval, got.fanout_seed) == (5, 7, 9)
    assert got.fanout_max_requests == 77
    untouched = locust_env(plan, Prepared(workload, None, [], False, 10), out)
    assert "LOCUST_FANOUT_TOKENS" not in untouched  # the caller's own, if any
    # No flag on the command line would shadow a variable.
    assert not [a for a in locust_command(plan, "http://127.0.0.1:1") if a.startswith("--fanout")]
