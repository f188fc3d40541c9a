"""The settings a checkpoint was built with, kept beside it, and the refusal to change them.

A checkpoint holds the join's state and the offsets its store reflects; some
settings decide what that state *is*, and a job that started with other values
would either read it wrong or, since the checkpoint's path names some of them
(:func:`views.job.checkpoint_path`), silently start a fresh, empty checkpoint beside
it and apply the whole log again onto the store the old one kept. Those settings
are written to ``<checkpoint dir>/view-settings.json`` the first time a job starts
there, and every later start takes the recorded values of those it was not given
(:func:`adopted`) and compares the rest: a job asked for other values is refused
with a message that names the way to change them — building a new view beside the
live one (``fanout rebuild --beside``), which switches reads to it once it has
caught up and verified.

Which settings: the state codec's layout (:data:`views.codec.LAYOUT`), the key
buckets and shuffle partitions (the state's partitioning), the timeline cap, the
celebrity threshold and demote ratio (decisions the state and the store already
hold), and the Kafka source (the form of the checkpoint's offsets). Settings that
only change how fast or how often the job works (trigger, batch size, page bytes)
may change on a running view.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Final

from views.codec import LAYOUT
from views.settings import ViewSettings

#: The file beside the checkpoints that records the settings they were built with.
FINGERPRINT_FILE: Final = "view-settings.json"

#: ViewSettings field -> the ``fanout rebuild --beside`` flag that changes it.
_FLAGS: Final = {"timeline_cap": "--timeline-cap", "celebrity_threshold": "--celebrity-threshold",
                 "key_buckets": "--key-buckets", "shuffle_partitions": "--shuffle-partitions",
                 "kafka_source": "--kafka-source"}
_STATE_DIR = re.compile(r"state-v\d+-p\d+-b\d+$")


def fingerprint(view: ViewSettings) -> dict[str, Any]:
    """The settings of ``view`` that a checkpoint cannot take a change of."""
    return {"layout": LAYOUT, "key_buckets": view.key_buckets,
            "shuffle_partitions": view.shuffle_partitions, "timeline_cap": view.timeline_cap,
            "celebrity_threshold": view.celebrity_threshold, "demote_ratio": view.demote_ratio,
            "kafka_source": view.kafka_source, "lateness_days": view.lateness_days}


def recorded(checkpoint_dir: Path) -> dict[str, Any] | None:
    """The fingerprint written beside ``checkpoint_dir``'s checkpoints, if any."""
    path = checkpoint_dir / FINGERPRINT_FILE
    return json.loads(path.read_text()) if path.exists() else None


def adopted(view: ViewSettings) -> ViewSettings:
    """``view`` with the recorded values of the settings nobody gave it.

    A setting the environment or a flag gives is asked for, and :func:`refusal` holds
    the checkpoint to it; one left at its default is taken from the record, so a
    default that changes between versions (the key buckets went from 64 to 16) does
    not strand a checkpoint built with the old one.
    """
    old = recorded(view.checkpoint_dir)
    if old is None:
        return view
    kept = {k: old[k] for k in fingerprint(view)
            if k != "layout" and k in old and k not in view.model_fields_set
            and old[k] != getattr(view, k)}
    return view.model_copy(update=kept) if kept else view


def refusal(view: ViewSettings, state_dir: Path) -> str | None:
    """Why a job of ``view`` must not start on its checkpoint directory; None if it may.

    ``state_dir`` is the checkpoint this job would use (:func:`views.job.checkpoint_path`).
    Without a recorded fingerprint, a started checkpoint of other partitioning beside
    it is refused all the same (a directory from before fingerprints were kept).
    """
    old = recorded(view.checkpoint_dir)
    new = fingerprint(view)
    if old is None:
        others = [d for d in _started_states(view.checkpoint_dir) if d != state_dir]
        if not others or _started(state_dir):
            return None
        return _message(view, f"the checkpoint {others[0]} was built with other partitioning "
                              f"(this job would start {state_dir.name} empty beside it)")
    changed = {k: (old.get(k), v) for k, v in new.items() if old.get(k) != v}
    if not changed:
        return None
    shown = ", ".join(f"{k} {was} -> {now}" for k, (was, now) in sorted(changed.items()))
    return _message(view, f"the checkpoint in {view.checkpoint_dir} was built with other "
                          f"settings than this job's ({shown}); a checkpoint cannot take "
                          "that change", changed)


def _message(view: ViewSettings, why: str, changed: dict[str, Any] | None = None) -> str:
    flags = " ".join(f"{_FLAGS[k]} {now}" for k, (_, now) in sorted((changed or {}).items())
                     if k in _FLAGS)
    beside = "fanout rebuild --beside" + (f" {flags}" if flags else "")
    return (f"{why}. To change them, build a new view beside the live one: `{beside}` "
            "(it reads the topics from the start into a new checkpoint and store while the "
            "live view serves, verifies it, then switches reads to it); or start this job "
            "with the checkpoint's settings (" + _listed(recorded(view.checkpoint_dir)) + ")")


def _listed(fp: dict[str, Any] | None) -> str:
    """The recorded settings as the environment gives them (``FANOUT_KEY_BUCKETS=64``).

    The layout is not a setting: only :data:`~views.codec.LAYOUT` can read its state.
    """
    if fp is None:
        return "as the stack recorded them"
    names = ViewSettings.env_names()
    return ", ".join(f"{names.get(k, k)}={v}" for k, v in sorted(fp.items()) if k != "layout")


def record(view: ViewSettings) -> None:
    """Write ``view``'s fingerprint beside its checkpoints (atomically), unless it is there."""
    path = view.checkpoint_dir / FINGERPRINT_FILE
    if path.exists():
        return
    view.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(fingerprint(view), indent=2, sort_keys=True))
    tmp.replace(path)


def _started_states(checkpoint_dir: Path) -> list[Path]:
    return sorted(d for d in checkpoint_dir.glob("state-v*")
                  if _STATE_DIR.match(d.name) and _started(d))


def _started(state_dir: Path) -> bool:
    return any(state_dir.glob("offsets/*"))
