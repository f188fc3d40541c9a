"""Settings of the read API process: where it listens, which store it reads, page sizes.

Built once at the process's entry point (``fanout serve``, ``python -m serving``),
never at import; every field can come from the environment variable named in its
alias, and CLI flags fall back to these (docs/style.md §6). The names that other code uses
are declared here once; the store's and the timeline cap's come from
:mod:`views.settings`, which the job shares.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

from pydantic import Field, SecretStr, model_validator

from ingest.settings import FanoutSettings
from ingest.settings import env_alias as _env
from serving.celebrities import FULL_RELOAD_S
from serving.errors import ConfigError
from views.pointer import VIEW_FILE_ENV
from views.settings import DEFAULT_STORE_URL, DEFAULT_TIMELINE_CAP, STORE_ENV, TIMELINE_CAP_ENV
from views.stores.versions import FEED_SHARDS, Shards

__all__ = ("ACCESS_LOG_ENV", "API_HOST_ENV", "API_PORT_ENV", "API_WORKERS_ENV", "AUTH_ENV", "AUTH_SECRET_ENV",
           "FAST_READS_ENV", "FEED_SHARDS_ENV", "MIN_SECRET", "READ_MODE_ENV", "WORKER_ID_ENV", "ServingSettings",
           "parse_shards")

API_HOST_ENV: Final = "FANOUT_API_HOST"
API_PORT_ENV: Final = "FANOUT_API_PORT"
READ_MODE_ENV: Final = "FANOUT_READ_MODE"
ACCESS_LOG_ENV: Final = "FANOUT_API_ACCESS_LOG"
AUTH_ENV: Final = "FANOUT_AUTH"
AUTH_SECRET_ENV: Final = "FANOUT_AUTH_SECRET"  # noqa: S105 - the variable's name
WORKER_ID_ENV: Final = "FANOUT_WORKER_ID"
API_WORKERS_ENV: Final = "FANOUT_API_WORKERS"
FEED_SHARDS_ENV: Final = "FANOUT_FEED_SHARDS"
FAST_READS_ENV: Final = "FANOUT_API_FAST_READS"

#: Shortest accepted auth secret: HMAC keys shorter than this are guessable.
MIN_SECRET = 16
#: The largest ``limit`` a live stream follows (serving.stream), and the most events one
#: change of its page makes: every entry removed and as many added, and a reset.
STREAM_MAX_LIMIT: Final = 100
STREAM_MAX_CHANGE: Final = 2 * STREAM_MAX_LIMIT + 1


class ServingSettings(FanoutSettings):
    """Listen address, store, paging, auth and write limits of the HTTP API (DESIGN §7)."""

    host: str = Field(
        default="127.0.0.1", validation_alias=_env(API_HOST_ENV, "host"),
        description="Interface the API binds to.")
    port: int = Field(
        default=8080, ge=0, le=65535, validation_alias=_env(API_PORT_ENV, "port"),
        description="TCP port of the API (0: any free port).")
    store_url: str = Field(
        default=DEFAULT_STORE_URL, validation_alias=_env(STORE_ENV, "store_url"),
        description="Store to read: sqlite:///path or cassandra://hosts/ks.")
    timeline_cap: int = Field(
        default=DEFAULT_TIMELINE_CAP, ge=1, validation_alias=_env(TIMELINE_CAP_ENV, "timeline_cap"),
        description="Cached entries per home timeline (the job's N).")
    default_page: int = Field(
        default=20, ge=1, validation_alias=_env("FANOUT_API_DEFAULT_PAGE", "default_page"),
        description="Entries per page when a request gives no limit.")
    max_page: int = Field(
        default=200, ge=1, validation_alias=_env("FANOUT_API_MAX_PAGE", "max_page"),
        description="Largest limit a request may ask for.")
    celebrity_refresh_s: float = Field(
        default=0.5, ge=0, validation_alias=_env("FANOUT_CELEBRITY_REFRESH_S",
                                                 "celebrity_refresh_s"),
        description="How often the in-process cache of celebrities' recent tweets is "
                    "reloaded (its staleness bound); 0 reads them from the store.")
    celebrity_full_reload_s: float = Field(
        default=FULL_RELOAD_S, gt=0, validation_alias=_env("FANOUT_CELEBRITY_FULL_RELOAD_S",
                                                           "celebrity_full_reload_s"),
        description="How often that cache reloads every celebrity whole: the longest a "
                    "late entry or an older delete can stay unseen in it.")
    workers: int = Field(
        default=1, ge=0, le=256, validation_alias=_env(API_WORKERS_ENV, "workers"),
        description="API processes sharing the port (SO_REUSEPORT); 0: one per core "
                    "(`fanout up` starts one per core unless this is set).")
    page_cache_mb: int = Field(
        default=64, ge=0, validation_alias=_env("FANOUT_API_PAGE_CACHE_MB", "page_cache_mb"),
        description="Rendered pages each API process keeps (MiB), re-validated against the "
                    "store on every read (serving.pagecache); 0 renders every read.")
    read_mode: Literal["fanout", "read"] = Field(
        default="fanout", validation_alias=_env(READ_MODE_ENV, "read_mode"),
        description="fanout: the materialized view (cache + celebrity merge); read: "
                    "evaluate the home query at read time from author_tweets and the "
                    "follow graph (the fan-out-on-read baseline for load tests).")
    fast_reads: Literal["middleware", "off"] = Field(
        default="middleware", validation_alias=_env(FAST_READS_ENV, "fast_reads"),
        description="Where a plainly valid page read is answered: middleware: by an ASGI "
                    "middleware without FastAPI's per-request work, with the bytes the route "
                    "would send (serving.reads.FastReads); off: by the routes only. For "
                    "benchmarks and for ruling the fast path out.")
    access_log: bool = Field(
        default=True, validation_alias=_env(ACCESS_LOG_ENV, "access_log"),
        description="Log every request (uvicorn's access log); turn off for load tests, "
                    "it adds latency.")
    # -- access control, writes, read-your-writes, limits --------------------------------
    auth: bool = Field(
        default=True, validation_alias=_env(AUTH_ENV, "auth"),
        description="on: writes and home timelines need the user's bearer token; off: "
                    "anyone may act as anyone (demos, read-path load tests).")
    auth_secret: SecretStr | None = Field(
        default=None, validation_alias=_env(AUTH_SECRET_ENV, "auth_secret"),
        description=f"HMAC key of the bearer tokens, at least {MIN_SECRET} characters; "
                    "required when auth is on (`fanout up` generates one).")
    token_ttl_s: int = Field(
        default=86_400, ge=1, le=366 * 86_400,
        validation_alias=_env("FANOUT_TOKEN_TTL_S", "token_ttl_s"),
        description="Lifetime of a token minted by `fanout token`.")
    after_timeout_ms: int = Field(
        default=5_000, ge=0, le=60_000,
        validation_alias=_env("FANOUT_AFTER_TIMEOUT_MS", "after_timeout_ms"),
        description="Longest a read with ?after=TOKEN waits for the view to apply it.")
    after_max_waiters: int = Field(
        default=16, ge=0, validation_alias=_env("FANOUT_AFTER_MAX_WAITERS", "after_max_waiters"),
        description="Reads that may wait on ?after= at once; more answer at once with "
                    "consistent=false (each waiter holds a worker thread).")
    write_timeout_ms: int = Field(
        default=5_000, ge=100, le=60_000,
        validation_alias=_env("FANOUT_WRITE_TIMEOUT_MS", "write_timeout_ms"),
        description="Longest a write waits for the broker's acknowledgement before 503.")
    delivery_timeout_ms: int = Field(
        default=60_000, ge=1_000, le=600_000,
        validation_alias=_env("FANOUT_WRITE_DELIVERY_MS", "delivery_timeout_ms"),
        description="Longest the producer keeps trying to deliver a write's record "
                    "(librdkafka's message.timeout.ms), at least the write timeout: longer "
                    "than a leader failover, so no record times out in flight (a timeout "
                    "bumps the idempotent producer's epoch, and a retry under the new epoch "
                    "can write a record twice). A write answered 503 may still land "
                    "within it.")
    retry_after_s: int = Field(
        default=2, ge=1, validation_alias=_env("FANOUT_RETRY_AFTER_S", "retry_after_s"),
        description="Retry-After of a 503 to a write; also how long writes fail fast "
                    "after the broker was found unreachable.")
    broker_check_s: float = Field(
        default=5.0, gt=0, validation_alias=_env("FANOUT_BROKER_CHECK_S", "broker_check_s"),
        description="/healthz asks the broker at most this often.")
    max_body_bytes: int = Field(
        default=16_384, ge=64, validation_alias=_env("FANOUT_API_MAX_BODY", "max_body_bytes"),
        description="Largest request body; larger answers 413.")
    activity_every_s: float = Field(
        default=3600.0, ge=0, validation_alias=_env("FANOUT_ACTIVITY_EVERY_S", "activity_every_s"),
        description="A home read is appended to the activity log (what inactive users are "
                    "derived from, DESIGN §4b) at most this often per user and API process; "
                    "keep it well below FANOUT_INACTIVE_DAYS. 0: reads are not logged.")
    view_file: Path | None = Field(
        default=None, validation_alias=_env(VIEW_FILE_ENV, "view_file"),
        description="A view pointer file (a run directory's view.json, views.pointer): when "
                    "set, the store it names is served instead of store_url, and every "
                    "worker switches to another view when the file names one (`fanout "
                    "rebuild --beside`; serving.switch).")
    # -- the live stream (serving.stream) ---------------------------------------------------
    stream_poll_s: float = Field(
        default=0.1, gt=0, le=10, validation_alias=_env("FANOUT_STREAM_POLL_S", "stream_poll_s"),
        description="How often an API process with open streams asks whether their pages "
                    "may have changed (one question to the page tokens); none when idle.")
    stream_heartbeat_s: float = Field(
        default=15.0, gt=0, validation_alias=_env("FANOUT_STREAM_HEARTBEAT_S",
                                                  "stream_heartbeat_s"),
        description="Seconds between the SSE comment lines that keep an idle stream open.")
    stream_retention_s: int = Field(
        default=86_400, ge=1, validation_alias=_env("FANOUT_STREAM_RETENTION_S",
                                                    "stream_retention_s"),
        description="A Last-Event-ID older than this gets a reset event (re-read the page) "
                    "instead of the changes since.")
    stream_queue: int = Field(
        default=512, ge=STREAM_MAX_CHANGE, validation_alias=_env("FANOUT_STREAM_QUEUE",
                                                                 "stream_queue"),
        description="Events a stream may have waiting to be sent; a change that does not fit "
                    f"cuts the client off (at least {STREAM_MAX_CHANGE}: one change's most).")
    stream_send_timeout_s: float = Field(
        default=10.0, gt=0, validation_alias=_env("FANOUT_STREAM_SEND_TIMEOUT_S",
                                                  "stream_send_timeout_s"),
        description="Longest one write to a stream's socket may wait before the client is "
                    "cut off.")
    feed_shards: str = Field(
        default="all", validation_alias=_env(FEED_SHARDS_ENV, "feed_shards"),
        description=f"The feed shards (0..{FEED_SHARDS - 1}, of users' pages by a hash of "
                    "the user) whose changes this process reads and whose pages it caches "
                    "and streams: `all`, or terms joined by commas, each a shard `S` or "
                    "`R/M`, the shards s with s % M == R (`3/8`: 3 and 11). Pages of other "
                    "users are served uncached; their streams answer 421 naming the shard "
                    "(DESIGN §7, Scaling out).")
    worker_id: int | None = Field(
        default=None, ge=0, le=1023, validation_alias=_env(WORKER_ID_ENV, "worker_id"),
        description="Snowflake worker id of this API process for tweet ids (random if "
                    "unset; give each API process its own when several take writes).")

    def secret(self) -> bytes:
        """The token key, or :class:`ConfigError` saying how to provide one."""
        value = self.auth_secret.get_secret_value() if self.auth_secret else ""
        if len(value) < MIN_SECRET:
            msg = (f"auth is on but {AUTH_SECRET_ENV} is {'too short' if value else 'unset'}: "
                   f"set it to a random string of at least {MIN_SECRET} characters (e.g. "
                   "`python -c 'import secrets; print(secrets.token_hex(32))'`), or set "
                   f"{AUTH_ENV}=off to serve without access control")
            raise ConfigError(msg)
        return value.encode()

    def shards(self) -> Shards:
        """The feed shards :attr:`feed_shards` names (None: all of them)."""
        return parse_shards(self.feed_shards)

    @model_validator(mode="after")
    def _default_fits(self) -> ServingSettings:
        if self.default_page > self.max_page:
            msg = f"default_page={self.default_page} exceeds max_page={self.max_page}"
            raise ValueError(msg)
        if self.delivery_timeout_ms < self.write_timeout_ms:
            msg = (f"delivery_timeout_ms={self.delivery_timeout_ms} is shorter than "
                   f"write_timeout_ms={self.write_timeout_ms}: a record must be tried for at "
                   "least as long as its request waits")
            raise ValueError(msg)
        self.shards()  # a bad spelling fails at startup
        return self


def parse_shards(text: str) -> Shards:
    """``all`` (or empty): None; else the union of the terms ``S`` and ``R/M`` (ValueError)."""
    if text.strip().lower() in ("", "all"):
        return None
    out: set[int] = set()
    for term in (t.strip() for t in text.split(",")):
        rest, slash, modulus = term.partition("/")
        try:
            r, m = int(rest), int(modulus) if slash else FEED_SHARDS
        except ValueError:
            r = m = -1
        if not 0 <= r < m <= FEED_SHARDS:
            msg = (f"{FEED_SHARDS_ENV}: {term!r} is not a shard 0..{FEED_SHARDS - 1} nor R/M "
                   f"with 0 <= R < M <= {FEED_SHARDS}")
            raise ValueError(msg)
        out.update(s for s in range(FEED_SHARDS) if s % m == r)
    return None if len(out) == FEED_SHARDS else frozenset(out)
