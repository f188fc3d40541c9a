"""Settings of the read API process: where it listens, which store it reads, page sizes.

Built once at the process's entry point (``fanout serve``, ``python -m serving``),
never at import; every field can come from the environment variable named in its
alias, and CLI flags fall back to these (STYLE §6).
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def _env(name: str, field: str) -> AliasChoices:
    return AliasChoices(name, field)


class ServingSettings(BaseSettings):
    """Listen address, store URL and paging limits of the HTTP API (DESIGN §7)."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    host: str = Field("127.0.0.1", validation_alias=_env("FANOUT_API_HOST", "host"),
                      description="Interface the API binds to.")
    port: int = Field(8080, ge=0, le=65535, validation_alias=_env("FANOUT_API_PORT", "port"),
                      description="TCP port of the API (0: any free port).")
    store_url: str = Field("sqlite:///run/fanout.sqlite",
                           validation_alias=_env("FANOUT_STORE", "store_url"),
                           description="Store to read: sqlite:///path or cassandra://hosts/ks.")
    timeline_cap: int = Field(800, ge=1,
                              validation_alias=_env("FANOUT_TIMELINE_CAP", "timeline_cap"),
                              description="Cached entries per home timeline (the job's N).")
    default_page: int = Field(20, ge=1,
                              validation_alias=_env("FANOUT_API_DEFAULT_PAGE", "default_page"),
                              description="Entries per page when a request gives no limit.")
    max_page: int = Field(200, ge=1, validation_alias=_env("FANOUT_API_MAX_PAGE", "max_page"),
                          description="Largest limit a request may ask for.")
    read_mode: Literal["fanout", "read"] = Field(
        "fanout", validation_alias=_env("FANOUT_READ_MODE", "read_mode"),
        description="fanout: the materialized view (cache + celebrity merge); read: "
                    "evaluate the home query at read time from author_tweets and the "
                    "follow graph (the fan-out-on-read baseline for load tests).")
    access_log: bool = Field(True, validation_alias=_env("FANOUT_API_ACCESS_LOG", "access_log"),
                             description="Log every request (uvicorn's access log); "
                                         "turn off for load tests, it adds latency.")

    @model_validator(mode="after")
    def _default_fits(self) -> ServingSettings:
        if self.default_page > self.max_page:
            msg = f"default_page={self.default_page} exceeds max_page={self.max_page}"
            raise ValueError(msg)
        return self
