"""Building the Spark driver's class archive (:mod:`infra.services.class_archive`): train, check, keep.

:func:`build` makes it the way the JDK makes a dynamic archive: a training run of the
real job on a small generated history (a Kafka node of its own, the Kafka source, the
join, the SQLite sink) in a JVM started with ``-XX:ArchiveClassesAtExit``, which writes
every class it loaded when it exits; then a second JVM must start with the archive and
``-Xshare:on`` (which refuses an archive it cannot use) before the archive takes its
place, under the name :func:`infra.services.spark.class_archive_path` gives for this JVM, these
jars and these options. The install step runs it (``fanout class-archive``, from
``make jars``).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from infra.errors import InfraError
from infra.services.class_archive import ARCHIVE_ENV, CACHE_ENV, OFF
from infra.services.process import run_saying
from infra.settings import SPARK_JAVA_OPTIONS_ENV

log = logging.getLogger(__name__)

#: What the training run replays: enough for a micro-batch of every record kind.
TRAINING_USERS: Final = 300
TRAINING_FOLLOWS: Final = 3_000
TRAINING_TWEETS: Final = 2_000
#: Seconds a training run, or the JVM writing its archive, may take.
TRAINING_TIMEOUT_S: Final = 900


class ClassArchiveError(InfraError):
    """The archive could not be built; Spark still runs without one."""


def build(*, rebuild: bool = False, workload: str = "job") -> tuple[Path, bool]:
    """The archive for this JVM and these jars, trained and checked if missing.

    Returns its path and whether it was built now. ``workload`` ``job`` trains on the
    view job (what the install step does); ``session`` only starts a session and runs
    one small query (what the tests use: the same mechanics, in seconds).
    """
    from infra.services.spark import class_archive_path  # pyspark: not for every `fanout` command

    target = class_archive_path()
    if target is None:
        msg = "no Java found to build a class archive for (JAVA_HOME unset, no `java` on PATH)"
        raise ClassArchiveError(msg)
    if target.is_file() and not rebuild:
        return target, False
    log.info("class archive: none for this JVM and these jars yet; building %s", target)
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".train-", dir=target.parent))
    try:
        draft = work / "draft.jsa"
        _child(["--train", str(draft), "--workload", workload], work,
               f"-XX:ArchiveClassesAtExit={draft}",
               what=f"class archive: training the Spark driver on a small run of the {workload}")
        if not draft.is_file():
            msg = f"the training JVM wrote no archive (its output is in {work})"
            raise ClassArchiveError(msg)
        # -Xshare:on: a JVM that cannot map the archive for this class path fails to start.
        _child(["--check"], work, "-Xshare:on", archive=draft,
               what="class archive: checking that a new driver maps it")
        family = target.name.rsplit("-", 1)[0]
        for stale in target.parent.glob(f"{family}-*.jsa"):
            stale.unlink(missing_ok=True)  # this install's, for jars or a JVM since replaced
        draft.replace(target)
    except BaseException:
        log.error("class archive: the training run's files are kept in %s", work)
        raise
    shutil.rmtree(work, ignore_errors=True)
    return target, True


def _child(args: list[str], work: Path, java_option: str, archive: Path | None = None,
           what: str = "class archive") -> None:
    """Run this module in a fresh interpreter (so with a JVM of its own) with one option.

    ``what`` names the run in the lines said while it goes on (:func:`run_saying`).
    """
    env = {**os.environ, ARCHIVE_ENV: str(archive) if archive else OFF,
           SPARK_JAVA_OPTIONS_ENV: " ".join(
               filter(None, (os.environ.get(SPARK_JAVA_OPTIONS_ENV, ""), java_option)))}
    out = work / f"{args[0].lstrip('-')}.log"
    with out.open("wb") as sink:
        done = run_saying([sys.executable, "-m", "infra.services.archive_builder", *args], what,
                          stdout=sink, cwd=work, env=env, timeout=TRAINING_TIMEOUT_S)
    if done.returncode != 0:
        # The JVM lists every class it could not archive as a warning; the cause follows.
        said = [line for line in out.read_text(errors="replace").strip().splitlines()
                if "[warning][cds]" not in line]
        msg = (f"class archive: `{' '.join(args)}` failed (exit {done.returncode}); its "
               "output ends:\n  " + "\n  ".join(said[-15:]) + f"\n(is {work.parent} "
               "writable, with ~200 MB free?)")
        raise ClassArchiveError(msg)


def _train(draft: Path, workload: str) -> int:
    """In the child: run ``workload``, then stop the JVM and wait while it writes ``draft``."""
    from pyspark import SparkContext

    from infra.services.spark import build_session

    work = draft.parent
    if workload == "job":
        _train_on_job(work)
    else:
        spark = build_session("fanout-class-archive", shuffle_partitions=2)
        spark.range(100).selectExpr("sum(id)").collect()
        spark.stop()
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if gateway is None or proc is None:
        return 1
    gateway.shutdown()
    proc.stdin.close()  # Spark's gateway exits on EOF; the archive is written on the way out
    proc.wait(timeout=TRAINING_TIMEOUT_S)
    return 0 if draft.is_file() else 1


def _train_on_job(work: Path) -> None:
    """The view job on a small generated history, from a Kafka node of its own to SQLite."""
    from infra.services.broker import KafkaBroker
    from infra.services.spark import build_session
    from ingest.generator import generate
    from ingest.producer import ChangelogProducer
    from ingest.settings import KafkaSettings
    from ingest.social import SOCIAL
    from ingest.topics import create_topics
    from views.job import start_query
    from views.settings import ViewSettings

    with KafkaBroker(work / "kafka") as broker:
        kafka = KafkaSettings(bootstrap=broker.bootstrap, partitions=2, topic_prefix="train_")
        create_topics(kafka)
        history = generate(TRAINING_USERS, TRAINING_FOLLOWS, TRAINING_TWEETS, seed=7, mix=SOCIAL)
        with ChangelogProducer(kafka) as producer:
            for event in history.events():
                producer.send(event)
            producer.flush(120)
        view = ViewSettings(store_url=f"sqlite:///{work / 'view.sqlite'}",
                            checkpoint_dir=work / "checkpoint")
        spark = build_session("fanout-class-archive", shuffle_partitions=view.shuffle_partitions)
        store = view.store().open()
        try:
            query = start_query(spark, kafka, view, store, available_now=True)
            query.awaitTermination(TRAINING_TIMEOUT_S)
            if query.exception() is not None:
                msg = f"the training job failed: {query.exception()}"
                raise ClassArchiveError(msg)
        finally:
            store.close()
            spark.stop()


def _check() -> int:
    """In the child: a session starts with the archive (``-Xshare:on``) and runs a query."""
    from infra.services.spark import build_session

    spark = build_session("fanout-class-archive-check", shuffle_partitions=2)
    total = spark.range(10).selectExpr("sum(id)").collect()[0][0]
    spark.stop()
    return 0 if total == 45 else 1


# -- the command -----------------------------------------------------------------------
def register(sub: argparse._SubParsersAction) -> None:
    """``fanout class-archive``: build the driver's class archive (the install step runs it)."""
    p = sub.add_parser("class-archive",
                       help="build the Spark driver's class-data-sharing archive (faster "
                            f"job starts; env {CACHE_ENV}, default ~/.cache/fanout/class-archive)")
    p.add_argument("--rebuild", action="store_true", help="build it even if one is cached")
    p.set_defaults(func=_cmd_class_archive)


def _cmd_class_archive(args: argparse.Namespace) -> int:
    if os.environ.get(ARCHIVE_ENV, "").strip().lower() == OFF:
        print(f"class archive: off ({ARCHIVE_ENV}={OFF})")
        return 0
    start = time.perf_counter()
    try:
        path, built = build(rebuild=args.rebuild)
    except ClassArchiveError as exc:
        print(f"{exc}\nSpark runs without a class archive, only slower to start; set "
              f"{ARCHIVE_ENV}={OFF} to skip this step.", file=sys.stderr)
        return 1
    size = path.stat().st_size / 2**20
    how = f"built in {time.perf_counter() - start:.0f}s" if built else "cached"
    print(f"class archive: {path} ({size:.0f} MB, {how})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The children of :func:`build`: ``--train DRAFT [--workload W]`` or ``--check``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m infra.services.archive_builder")
    parser.add_argument("--train", type=Path)
    parser.add_argument("--workload", choices=("job", "session"), default="job")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    if args.check:
        return _check()
    if args.train is None:
        parser.error("--train DRAFT or --check")
    return _train(args.train.resolve(), args.workload)


if __name__ == "__main__":
    sys.exit(main())
