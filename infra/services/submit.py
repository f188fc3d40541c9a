"""The view job as a spark-submit application: ``spark-submit ... infra/services/submit.py``.

``fanout job`` starts Spark in-process, bound to loopback (one machine). On a cluster
the driver runs under spark-submit and executors on other hosts must reach it, so
this entry point builds the same session (:func:`infra.services.spark.build_session`) with
the driver advertised under a name the executors resolve and bound to every
interface, then runs :func:`views.job.run` unchanged. ``SPARK_MASTER`` is required
and must equal spark-submit's ``--master`` (the session builder sets the master too,
and would otherwise fall back to local mode); the rest comes from the usual settings
(``KAFKA_BOOTSTRAP``, ``FANOUT_STORE``, ``FANOUT_CHECKPOINT_DIR``, ...). The checkpoint
directory must be shared by the driver and every executor (a volume mounted at the
same path, or HDFS/S3), because executors write the state store there. Executors
import ``views`` and ``ingest``: run them from the same image
(``infra/docker/Dockerfile``).
"""

from __future__ import annotations

import logging
import os
import socket
import sys

from pydantic import Field

from ingest.settings import BOOTSTRAP_ENV, FanoutSettings, KafkaSettings, SettingsError, env_alias

log = logging.getLogger("fanout.submit")


class SubmitSettings(FanoutSettings):
    """Where the driver listens and what it tells executors to call it."""

    master: str = Field(
        default="", validation_alias=env_alias("SPARK_MASTER", "master"),
        description="The cluster's master URL, as given to spark-submit --master.")
    driver_host: str = Field(
        default_factory=socket.gethostname,
        validation_alias=env_alias("FANOUT_DRIVER_HOST", "driver_host"),
        description="Name or address executors use to reach the driver (default: hostname).")
    driver_bind: str = Field(
        default="0.0.0.0",  # noqa: S104 - executors on other hosts must reach the driver
        validation_alias=env_alias("FANOUT_DRIVER_BIND", "driver_bind"),
        description="Interface the driver binds to.")

    def spark_conf(self) -> dict[str, str]:
        """Overrides of :func:`infra.services.spark.session_conf` for a driver on a network."""
        return {"spark.driver.host": self.driver_host,
                "spark.driver.bindAddress": self.driver_bind}


def main() -> int:
    """Run the view job until SIGTERM; the exit code of :func:`views.job.run`."""
    from infra.services.process import stop_on_signals
    from infra.services.spark import build_session
    from views.job import run
    from views.settings import ViewSettings

    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        submit = SubmitSettings.from_env(os.environ)
        kafka, view = KafkaSettings.from_env(os.environ), ViewSettings.from_env(os.environ)
    except SettingsError as exc:
        log.error("%s", exc)
        return 2
    if not kafka.bootstrap or not submit.master:
        log.error("%s and SPARK_MASTER must both be set (SPARK_MASTER equal to "
                  "spark-submit's --master, e.g. spark://spark-master:7077)", BOOTSTRAP_ENV)
        return 2
    spark = build_session("fanout-views", shuffle_partitions=view.shuffle_partitions,
                          master=submit.master, extra_conf=submit.spark_conf())
    log.info("driver %s (bound to %s), master %s", submit.driver_host, submit.driver_bind,
             spark.sparkContext.master)
    return run(spark, kafka, view, stop_on_signals())


if __name__ == "__main__":
    sys.exit(main())
