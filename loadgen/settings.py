"""Settings of the locustfile's workload: who acts, in which mix, at what rate, recorded where.

The one home of the ``LOCUST_FANOUT_*`` variable names (docs/style.md §6). Each field
is named as its flag, ``fanout_rate`` for ``--fanout-rate``: Locust keeps its options
and a locustfile's in one namespace, where ``--profile`` and ``--users`` are its own.
The locustfile makes its flags of the fields (:meth:`~ingest.settings.FanoutSettings.add_flags`)
and builds the settings from them over the environment over the defaults; ``fanout
load`` hands a Locust child its values in these variables (:meth:`env_names`). Nothing
here imports Locust, which monkey-patches the process that imports it with gevent.
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import AliasGenerator, Field
from pydantic_settings import SettingsConfigDict

from ingest.settings import FanoutSettings, env_alias
from loadgen.workload import DEFAULT_PROFILE, PROFILES

__all__ = ("SECRET_FIELD", "LocustSettings")

#: The field the locustfile puts on Locust's parser itself, where the web UI masks it.
SECRET_FIELD: Final = "fanout_auth_secret"  # noqa: S105 - a field's name


class LocustSettings(FanoutSettings):
    """The fanout workload of a Locust run (``loadgen/locustfile.py``).

    Each field's variable is its name in capitals after ``LOCUST_``: ``fanout_rate`` is
    ``LOCUST_FANOUT_RATE`` (:meth:`env_names` lists them).
    """

    model_config = SettingsConfigDict(alias_generator=AliasGenerator(
        validation_alias=lambda field: env_alias(f"LOCUST_{field.upper()}", field)))

    fanout_users: str = Field("1-2000", description="User ids to act as, lo-hi.")
    fanout_workload: str = Field("", description="Workload JSON from `fanout load` (users "
                                 "ranked by activity); overrides --fanout-users.")
    fanout_profile: str = Field(DEFAULT_PROFILE, description=(
        f"Action mix: one of {', '.join(PROFILES)}, optionally with overrides, e.g. "
        "social:repost=2,page=0.5."))
    fanout_rate: float = Field(0, description="Open loop: total actions/s over all processes, "
                               "each timed from its intended send time; 0 = closed loop.")
    fanout_arrivals: Literal["constant", "poisson"] = Field(
        "constant", description="Open-loop schedule.")
    fanout_think: float = Field(0, description="Closed loop: mean think time in s between "
                                "actions, uniform on [0, 2x].")
    fanout_warmup: float = Field(0, description="Seconds after the start whose requests are "
                                 "left out of the histograms.")
    fanout_tokens: str = Field("", description='Bearer tokens file {"tokens": {id: token}}.')
    fanout_auth_secret: str = Field("", description="The API's FANOUT_AUTH_SECRET: mint tokens "
                                    "for every user.")
    fanout_out: str = Field("", description="Directory for hdr.json and live.json.")
    fanout_interval: float = Field(1, description="Seconds per timeline interval.")
    fanout_max_requests: int = Field(0, description="Stop after this many measured requests; "
                                     "0 = no bound.")
    fanout_seed: int = Field(0, description="Seed of the user and action draws.")
    # -- the stream holders (loadgen.streamer) --------------------------------------------
    fanout_streams: int = Field(-1, description="Users (of -u) that hold a live home stream; "
                                "-1 = the profile's share, 10% in social.")
    fanout_stream_limit: int = Field(20, description="Entries of the streamed window.")
    fanout_stream_hold: float = Field(60, description="Mean seconds a stream is held before its "
                                      "client leaves and resumes.")
    fanout_stream_away: float = Field(2, description="Mean seconds a client stays away before "
                                      "resuming with Last-Event-ID.")
    fanout_celebrities: str = Field("", description="Celebrity ids, comma-separated, for the "
                                    "push latency split (none: the workload's).")

    def recorded(self) -> dict[str, object]:
        """The settings as a run's results record them: all but the secret."""
        return self.model_dump(exclude={SECRET_FIELD})
