"""Settings of the view job and its store, built once at the job's entry point."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from views.join import JoinConfig


def _env(name: str, field: str) -> AliasChoices:
    return AliasChoices(name, field)


class ViewSettings(BaseSettings):
    """Where the views go and how the join behaves (DESIGN §4–§6)."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    store_url: str = Field("sqlite:///run/fanout.sqlite",
                           validation_alias=_env("FANOUT_STORE", "store_url"))
    timeline_cap: int = Field(800, ge=1, validation_alias=_env("FANOUT_TIMELINE_CAP",
                                                                 "timeline_cap"))
    celebrity_threshold: int = Field(
        1000, ge=1, validation_alias=_env("FANOUT_CELEBRITY_THRESHOLD", "celebrity_threshold"))
    demote_ratio: float = Field(0.8, gt=0, le=1,
                                validation_alias=_env("FANOUT_DEMOTE_RATIO", "demote_ratio"))
    checkpoint_dir: Path = Field(Path("run/checkpoints"),
                                 validation_alias=_env("FANOUT_CHECKPOINT_DIR", "checkpoint_dir"))
    trigger_seconds: float = Field(0.5, ge=0,
                                   validation_alias=_env("FANOUT_TRIGGER_SECONDS",
                                                         "trigger_seconds"))
    max_records_per_batch: int = Field(
        50_000, ge=1, validation_alias=_env("FANOUT_MAX_RECORDS_PER_BATCH",
                                            "max_records_per_batch"))
    key_buckets: int = Field(
        64, ge=1, le=1 << 20, validation_alias=_env("FANOUT_KEY_BUCKETS", "key_buckets"),
        description="Hash buckets of authors: the processor's unit of work and of state.")
    shuffle_partitions: int = Field(2, ge=1, validation_alias=_env("FANOUT_SHUFFLE_PARTITIONS",
                                                                     "shuffle_partitions"))
    broker_retry_s: float = Field(
        120.0, ge=0, validation_alias=_env("FANOUT_BROKER_RETRY_S", "broker_retry_s"),
        description="How long the job retries an unreachable broker (with backoff) "
                    "before it stops with an error.")

    kafka_source: Literal["spark", "python"] = Field(
        "spark", validation_alias=_env("FANOUT_KAFKA_SOURCE", "kafka_source"),
        description="Which Kafka source the job reads with: Spark's own connector "
                    "(spark-sql-kafka-0-10, the default: as fast in the whole pipeline "
                    "and far less of our code) or the project's Python source "
                    "(views.source); see benchmarks/RESULTS.md.")

    def join_config(self) -> JoinConfig:
        return JoinConfig.with_ratio(self.timeline_cap, self.celebrity_threshold,
                                     self.demote_ratio)
