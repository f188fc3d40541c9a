"""Settings of the view job and its store, built once at the job's entry point.

The one home of the store's and the join's environment variable names and of the
defaults the read API and ``infra`` share with the job (the store URL, the timeline
cap, where a run directory keeps the store and the checkpoint).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

from pydantic import Field

from ingest.settings import FanoutSettings, env_alias
from views.codec import DEFAULT_PAGE_BYTES
from views.join import DAY_MS, JoinConfig
from views.stores import store_from_url
from views.stores.base import Store, ViewWriter

__all__ = ("CELEBRITY_THRESHOLD_ENV", "CHECKPOINTS", "CHECKPOINT_DIR_ENV",
           "DEFAULT_CELEBRITY_THRESHOLD", "DEFAULT_CHECKPOINT_DIR",
           "DEFAULT_RUN_DIR", "DEFAULT_TRIGGER_SECONDS",
           "DEFAULT_STORE_URL", "DEFAULT_TIMELINE_CAP", "INACTIVE_DAYS_ENV", "KAFKA_SOURCE_ENV",
           "LATENESS_DAYS_ENV", "STORE_ENV",
           "STORE_FILE", "TIMELINE_CAP_ENV", "ViewSettings", "sqlite_url")

STORE_ENV: Final = "FANOUT_STORE"
TIMELINE_CAP_ENV: Final = "FANOUT_TIMELINE_CAP"
CELEBRITY_THRESHOLD_ENV: Final = "FANOUT_CELEBRITY_THRESHOLD"
CHECKPOINT_DIR_ENV: Final = "FANOUT_CHECKPOINT_DIR"
KAFKA_SOURCE_ENV: Final = "FANOUT_KAFKA_SOURCE"
INACTIVE_DAYS_ENV: Final = "FANOUT_INACTIVE_DAYS"
LATENESS_DAYS_ENV: Final = "FANOUT_LATENESS_DAYS"

#: Where a run directory keeps the SQLite store and the Spark checkpoint.
DEFAULT_RUN_DIR: Final = Path("run")
STORE_FILE: Final = "fanout.sqlite"
CHECKPOINTS: Final = "checkpoints"
DEFAULT_TIMELINE_CAP: Final = 800
DEFAULT_CELEBRITY_THRESHOLD: Final = 1000
#: A micro-batch starts at most this often. A tweet waits for the next start, then
#: for its batch (~0.35 s at 500 tweets/s): at 200k users 0.25 s against 0.5 s gave
#: post → visible p50 0.60 / p99 0.92 s against 0.71 / 1.03 s, for 11 % more
#: executor CPU a tweet (benchmarks/RESULTS.md, "Defaults and what they measured").
DEFAULT_TRIGGER_SECONDS: Final = 0.25


def sqlite_url(run_dir: Path) -> str:
    """The URL of the SQLite store kept in ``run_dir``."""
    return f"sqlite:///{run_dir / STORE_FILE}"


DEFAULT_STORE_URL: Final = sqlite_url(DEFAULT_RUN_DIR)
DEFAULT_CHECKPOINT_DIR: Final = DEFAULT_RUN_DIR / CHECKPOINTS


class ViewSettings(FanoutSettings):
    """Where the views go and how the join behaves (DESIGN §4–§6)."""

    store_url: str = Field(DEFAULT_STORE_URL, validation_alias=env_alias(STORE_ENV, "store_url"),
                           description="Where the views go: sqlite:///path or "
                                       "cassandra://hosts/keyspace.")
    timeline_cap: int = Field(DEFAULT_TIMELINE_CAP, ge=1,
                              validation_alias=env_alias(TIMELINE_CAP_ENV, "timeline_cap"),
                              description="Cached entries per home timeline.")
    celebrity_threshold: int = Field(
        DEFAULT_CELEBRITY_THRESHOLD, ge=1,
        validation_alias=env_alias(CELEBRITY_THRESHOLD_ENV, "celebrity_threshold"),
        description="Followers that make an author a celebrity.")
    demote_ratio: float = Field(0.8, gt=0, le=1,
                                validation_alias=env_alias("FANOUT_DEMOTE_RATIO", "demote_ratio"))
    inactive_days: float = Field(
        30.0, ge=0, validation_alias=env_alias(INACTIVE_DAYS_ENV, "inactive_days"),
        description="Users who have not read their home timeline for this many days "
                    "(event time, from the activity log) get no fan-out writes; their "
                    "next read is evaluated at read time and regenerates the cache "
                    "(DESIGN §4b; Twitter used 30, Mastodon 7). 0 turns it off.")
    lateness_days: float = Field(
        3.0, ge=0, validation_alias=env_alias(LATENESS_DAYS_ENV, "lateness_days"),
        description="The lateness bound (DESIGN §4): a tweets or follows record whose "
                    "created_at is more than this many days before the newest created_at "
                    "of an earlier record of its key and topic is late, a dead letter with "
                    "the reason `late`; tombstones, undos and dead edges are kept only "
                    "while an on-time record could still need them. verify applies the "
                    "same rule. 0 turns it off (no record is late, that state is kept for "
                    "good). A checkpoint's state was pruned with its bound: change it only "
                    "by rebuilding the view.")
    checkpoint_dir: Path = Field(DEFAULT_CHECKPOINT_DIR,
                                 validation_alias=env_alias(CHECKPOINT_DIR_ENV, "checkpoint_dir"))
    trigger_seconds: float = Field(
        DEFAULT_TRIGGER_SECONDS, ge=0,
        validation_alias=env_alias("FANOUT_TRIGGER_SECONDS", "trigger_seconds"),
        description="Seconds between micro-batch starts (0: back to back). A shorter "
                    "one shows a tweet sooner for more CPU a tweet; a job that is "
                    "behind runs its batches back to back whatever it is.")
    max_records_per_batch: int | None = Field(
        None, ge=1,
        validation_alias=env_alias("FANOUT_MAX_RECORDS_PER_BATCH", "max_records_per_batch"),
        description="Records a micro-batch takes at most (Kafka's maxOffsetsPerTrigger); "
                    "unset, what the store writes best with (its catch_up_records: "
                    "SQLite 200,000, Cassandra 1,000,000). It binds only when the job is "
                    "behind (a replay, a burst): a batch of follows touches about every "
                    "page of a large state, so its cost is about the state's bytes, "
                    "whatever its record count; the cap decides how many records share "
                    "that cost (benchmarks/RESULTS.md, the scale benchmark).")
    key_buckets: int = Field(
        16, ge=1, le=1 << 20, validation_alias=env_alias("FANOUT_KEY_BUCKETS", "key_buckets"),
        description="Hash buckets of authors: the processor's unit of work and of state. "
                    "Each bucket a batch touches costs a call and three state round trips "
                    "besides its pages', so a batch costs less with fewer; the buckets "
                    "must still outnumber the shuffle partitions several times, or a "
                    "partition's task gets more of them than the others "
                    "(benchmarks/RESULTS.md, \"Defaults and what they measured\").")
    state_page_bytes: int = Field(
        DEFAULT_PAGE_BYTES, ge=1024,
        validation_alias=env_alias("FANOUT_STATE_PAGE_BYTES", "state_page_bytes"),
        description="Average bytes of a page of authors' join state before a bucket "
                    "splits one (views.codec.Layout): a batch reads and writes the pages "
                    "it touches, two state calls and these bytes each. A running job "
                    "may change it: pages split further, or stop splitting.")
    shuffle_partitions: int = Field(2, ge=1,
                                    validation_alias=env_alias("FANOUT_SHUFFLE_PARTITIONS",
                                                               "shuffle_partitions"))
    broker_retry_s: float = Field(
        120.0, ge=0, validation_alias=env_alias("FANOUT_BROKER_RETRY_S", "broker_retry_s"),
        description="How long the job retries an unreachable broker (with backoff) "
                    "before it stops with an error.")

    kafka_source: Literal["spark", "python"] = Field(
        "spark", validation_alias=env_alias(KAFKA_SOURCE_ENV, "kafka_source"),
        description="Which Kafka source the job reads with: Spark's own connector "
                    "(spark-sql-kafka-0-10, the default: as fast in the whole pipeline "
                    "and far less of our code) or the project's Python source "
                    "(views.source); see benchmarks/RESULTS.md.")

    def store(self) -> Store:
        """The store this job writes (not opened)."""
        return store_from_url(self.store_url, cap=self.timeline_cap,
                              inactive_days=self.inactive_days)

    def records_per_batch(self, store: ViewWriter) -> int:
        """The cap on a micro-batch's records: the setting, else what ``store`` writes best with."""
        return self.max_records_per_batch or store.catch_up_records

    def lateness_ms(self) -> int | None:
        """The lateness bound in milliseconds, None when off (``lateness_days`` 0)."""
        return round(self.lateness_days * DAY_MS) if self.lateness_days > 0 else None

    def join_config(self) -> JoinConfig:
        return JoinConfig.with_ratio(self.timeline_cap, self.celebrity_threshold,
                                     self.demote_ratio, self.lateness_ms())
