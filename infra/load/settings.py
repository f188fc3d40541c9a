"""Settings of ``fanout load`` that fall back to the environment: the ``FANOUT_LOAD_*`` names.

The one home of the variables only ``fanout load`` reads (docs/style.md §6): what it
loads, with which mix, for how long, at what rate, and where its reports go. Its
other flags are switches and bounds of one invocation, with no variable behind them.
The command builds these from its flags over ``args.environ`` over the defaults
(:mod:`infra.load.run`); the bounds are checked with the rest of the plan, whose
messages name the flags.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasGenerator, Field
from pydantic_settings import SettingsConfigDict

from ingest.settings import FanoutSettings, env_alias
from loadgen.workload import DEFAULT_PROFILE, PROFILES

__all__ = ("LoadSettings",)


class LoadSettings(FanoutSettings):
    """What ``fanout load`` loads, how, and where its report goes.

    Each field's variable is its name in capitals after ``FANOUT_LOAD_`` (``rate`` is
    ``FANOUT_LOAD_RATE``), but for the reports' directory: ``FANOUT_REPORTS_DIR``.
    """

    model_config = SettingsConfigDict(alias_generator=AliasGenerator(
        validation_alias=lambda field: env_alias(f"FANOUT_LOAD_{field.upper()}", field)))

    target: str = Field("", description="API to load (none: the stack up in the run "
                        "directory).")
    profile: str = Field(DEFAULT_PROFILE, description=(
        f"Action mix: {', '.join(PROFILES)}, or profile:key=value,... ({DEFAULT_PROFILE}: ~65 "
        "reads per write, posts, replies, reposts, blocks, mutes and account deletions in the "
        "proportions of ingest/social.py)."))
    duration: float = Field(60, description="Measured seconds per mode.")
    warmup: float = Field(10, description="Seconds of load before measuring.")
    rate: float = Field(100, description="Open loop: actions/s; 0 = closed loop with --users.")
    users: int = Field(32, description="Locust users: concurrency of the open loop, or the "
                       "closed loop's users.")
    reports: Path = Field(Path("reports"), description="Where reports go.",
                          validation_alias=env_alias("FANOUT_REPORTS_DIR", "reports"))
