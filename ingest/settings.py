"""Settings of the changelog side, and the base every fanout settings class shares.

Settings are built once at a process's entry point (never at import), from its flags
over its environment over the defaults (docs/style.md §6). Each package's settings module is
the one home of its environment variable names and shared defaults, as Quix Streams
keeps its own: a name is declared once, in its field's alias, and a name that other
code uses too (a child's environment, a message, a ``--help``) is a constant there,
exported in ``__all__``. This module is that home for the broker and the topics, and
holds :class:`FanoutSettings`, which the other packages' settings build on (every
package may import ``ingest``; DESIGN §2).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, Literal, Self, get_args, get_origin

from pydantic import AliasChoices, Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from ingest.events import TOPICS

__all__ = ("BOOTSTRAP_ENV", "PARTITIONS_ENV", "REPLICATION_ENV", "TOPIC_PREFIX_ENV",
           "FanoutSettings", "KafkaSettings", "SettingsError", "env_alias")

BOOTSTRAP_ENV: Final = "KAFKA_BOOTSTRAP"
PARTITIONS_ENV: Final = "FANOUT_PARTITIONS"
REPLICATION_ENV: Final = "FANOUT_REPLICATION"
TOPIC_PREFIX_ENV: Final = "FANOUT_TOPIC_PREFIX"


class SettingsError(ValueError):
    """A flag or variable whose value a setting cannot take; the message names each."""


def env_alias(name: str, field: str) -> AliasChoices:
    """A field's aliases: its environment variable first, then its own name (for flags)."""
    return AliasChoices(name, field)


class FanoutSettings(BaseSettings):
    """Frozen settings whose fields each name their variable first in :func:`env_alias`.

    The environment is read for each field's variable alone, by its exact name
    (:class:`_Variables`): pydantic-settings' own source also reads a field's name in any
    case, so ``PORT`` or ``HOST``, which hosting platforms set, would have set the API's.
    """

    model_config = SettingsConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    @classmethod
    def settings_customise_sources(
            cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Given values, then each field's variable (no dotenv or secrets files)."""
        return init_settings, _Variables(settings_cls)

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **flags: Any) -> Self:
        """Flags (by field name; None means not given) over ``environ`` over the defaults.

        ``environ`` is the process's environment, or that over a fallback one (``fanout``
        points its subcommands at the run directory's stack so); what neither gives is
        read from the field's variable in ``os.environ`` (:class:`_Variables`).
        """
        given: dict[str, Any] = {name: environ[var] for name, var in cls.env_names().items()
                                 if var in environ}
        flagged = {name: value for name, value in flags.items() if value is not None}
        given.update(flagged)
        try:
            return cls(**given)
        except ValidationError as exc:
            raise SettingsError(cls._explain(exc, set(flagged))) from None

    @classmethod
    def _explain(cls, exc: ValidationError, flagged: set[str]) -> str:
        """Each bad value by where it came from: ``--flag 'x': why`` or ``VAR='x': why``.

        A secret's value is never shown, and a check over several fields (no field of
        its own) says only why.
        """
        names = cls.env_names()
        fields = {var: name for name, var in names.items()}
        said = []
        for error in exc.errors():
            if not error["loc"]:
                said.append(error["msg"])
                continue
            field = fields.get(str(error["loc"][0]), str(error["loc"][0]))
            secret = "secret" in field
            value = "'***'" if secret else repr(error["input"])
            if error["type"] == "missing":
                shown = f"{names.get(field, field)} is not set"
            elif field in flagged:
                shown = f"--{field.replace('_', '-')} {value}"
            else:
                shown = f"{names.get(field, field)}={value}"
            said.append(f"{shown}: {error['msg']}")
        return "bad setting: " + "; ".join(said)

    @classmethod
    def env_names(cls) -> dict[str, str]:
        """Field name -> its environment variable."""
        return {name: str(f.validation_alias.choices[0])
                for name, f in cls.model_fields.items()
                if isinstance(f.validation_alias, AliasChoices)}

    @classmethod
    def env_help(cls, field: str) -> str:
        """``env NAME; default VALUE`` of a field, for a flag's ``--help``."""
        return f"env {cls.env_names()[field]}; default {_shown(cls.model_fields[field].default)}"

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser | argparse._ArgumentGroup, *fields: str,
                  **named: str) -> dict[str, argparse.Action]:
        """A flag for each field, built from the field; each field's flag, by field.

        The flag is ``--field-name`` (or the one ``named`` gives it), of the field's type,
        helped by its description and :meth:`env_help`. A flag not given is None, so
        :meth:`from_env` falls back to the environment. The flags returned take what is
        the parser's rather than the field's: a ``metavar``, or Locust's ``is_secret``.
        """
        flags: dict[str, argparse.Action] = {}
        for field in (*fields, *named):
            info = cls.model_fields[field]
            flag = named.get(field) or "--" + field.replace("_", "-")
            text = f"{info.description or ''} ({cls.env_help(field)})".lstrip()
            how: dict[str, Any]
            if info.annotation is bool:
                how = {"action": argparse.BooleanOptionalAction}
            elif get_origin(info.annotation) is Literal:
                how = {"choices": get_args(info.annotation)}
            elif info.annotation in _FLAG_TYPES:
                how = {"type": _FLAG_TYPES[info.annotation]}
            else:
                msg = f"{cls.__name__}.{field}: no flag for a {info.annotation}"
                raise TypeError(msg)
            flags[field] = parser.add_argument(flag, dest=field, default=None,
                                               help=text.replace("%", "%%"), **how)
        return flags


class _Variables(PydanticBaseSettingsSource):
    """The process environment's value of each field's variable (its first alias).

    A field without a variable is not read from the environment.
    """

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        variable = self._names().get(field_name)
        return (os.environ.get(variable) if variable else None), variable or field_name, False

    def __call__(self) -> dict[str, Any]:
        return {var: os.environ[var] for var in self._names().values() if var in os.environ}

    def _names(self) -> dict[str, str]:
        names: dict[str, str] = self.settings_cls.env_names()  # type: ignore[attr-defined]
        return names


#: What a flag of a field of each plain type parses its value with.
_FLAG_TYPES: Mapping[object, Callable[[str], object]] = {int: int, float: float, str: str,
                                                         Path: Path}


def _shown(value: object) -> object:
    if isinstance(value, bool):
        return "on" if value else "off"
    return "none" if value in (None, "") else value


class KafkaSettings(FanoutSettings):
    """Broker address and topic layout (DESIGN §3)."""

    bootstrap: str = Field(
        default="",
        validation_alias=env_alias(BOOTSTRAP_ENV, "bootstrap"),
        description="host:port of a Kafka cluster; empty means the local Kafka node.",
    )
    partitions: int = Field(
        default=4, ge=1, le=1024,
        validation_alias=env_alias(PARTITIONS_ENV, "partitions"),
        description="Partitions of every topic (equal, so the topics are co-partitioned).",
    )
    replication: int = Field(
        default=1, ge=1,
        validation_alias=env_alias(REPLICATION_ENV, "replication"),
    )
    topic_prefix: str = Field(
        default="",
        validation_alias=env_alias(TOPIC_PREFIX_ENV, "topic_prefix"),
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
