"""Settings of the changelog side: where the broker is and how topics are laid out.

Built once at a process's entry point (never at import); every field can come from
the environment variable named in its alias, and CLI flags fall back to these.
"""

from __future__ import annotations

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from ingest.events import TOPICS


class KafkaSettings(BaseSettings):
    """Broker address and topic layout (DESIGN §3)."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    bootstrap: str = Field(
        default="",
        validation_alias=AliasChoices("KAFKA_BOOTSTRAP", "bootstrap"),
        description="host:port of a Kafka cluster; empty means the local Kafka node.",
    )
    partitions: int = Field(
        default=4, ge=1, le=1024,
        validation_alias=AliasChoices("FANOUT_PARTITIONS", "partitions"),
        description="Partitions of every topic (equal, so the topics are co-partitioned).",
    )
    replication: int = Field(
        default=1, ge=1,
        validation_alias=AliasChoices("FANOUT_REPLICATION", "replication"),
    )
    topic_prefix: str = Field(
        default="",
        validation_alias=AliasChoices("FANOUT_TOPIC_PREFIX", "topic_prefix"),
        description="Prefix of the physical topic names (tests use a unique one each).",
    )

    def topic(self, logical: str) -> str:
        """Physical name of a logical topic (``tweets``, ``follows``, ``users``)."""
        return f"{self.topic_prefix}{logical}"

    def logical(self, physical: str) -> str:
        """Inverse of :meth:`topic`."""
        name = physical.removeprefix(self.topic_prefix)
        if name not in TOPICS:
            msg = f"topic {physical!r} is not one of fanout's topics"
            raise ValueError(msg)
        return name

    def physical_topics(self) -> list[str]:
        return [self.topic(t) for t in TOPICS]
