"""Where a micro-batch's time goes, stage by stage, from Spark's event log.

    FANOUT_BENCH_EVENT_LOG=/tmp/events .venv/bin/python benchmarks/bench_freshness.py --rate 500
    .venv/bin/python benchmarks/tools/stages.py /tmp/events --last 60 --name stages-500

A benchmark's pipeline (``benchmarks/pipeline.py``) writes Spark's event log into the
directory ``FANOUT_BENCH_EVENT_LOG`` names. Each micro-batch of the view job is a Spark
job of two stages: the Kafka read and the decode (which ends in the shuffle), then the
join (``transformWithStateInPandas``, whose output the sink collects). For the last
``--last`` jobs this prints the jobs' durations and, per stage (by its place in the
job), its duration and its tasks': wall time, executor run time, the executor's CPU
time (the task thread's only: the Python worker's CPU and the state server's thread are
not in it, so run time minus CPU is time the task waited on them), deserialisation and
scheduler delay, with the other benchmarks' percentiles (``pipeline.percentile``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The benchmarks' own modules, beside this folder.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import save  # noqa: E402
from pipeline import percentile  # noqa: E402

#: Task figures, each (name, how to read it from a task-end event) in milliseconds.
TASK_FIGURES = (
    ("wall", lambda e: e["Task Info"]["Finish Time"] - e["Task Info"]["Launch Time"]),
    ("run", lambda e: e["Task Metrics"]["Executor Run Time"]),
    ("cpu", lambda e: e["Task Metrics"]["Executor CPU Time"] / 1e6),
    ("deserialize", lambda e: e["Task Metrics"]["Executor Deserialize Time"]),
)


@dataclass
class Stage:
    name: str = ""
    submitted: int | None = None
    completed: int | None = None
    tasks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def duration(self) -> int | None:
        if self.submitted is None or self.completed is None:
            return None
        return self.completed - self.submitted


@dataclass
class Job:
    started: int
    stage_ids: list[int]
    ended: int | None = None


def events(directory: Path) -> Iterator[dict[str, Any]]:
    """Every event of the logs under ``directory`` (Spark writes one file, or a folder of
    rolled files an application)."""
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        if path.name.startswith((".", "appstatus")) or path.suffix in (".crc", ".inprogress"):
            continue
        with path.open() as fh:
            for line in fh:
                if line.strip():
                    yield json.loads(line)


def parse(log: Iterable[dict[str, Any]]) -> tuple[dict[int, Job], dict[int, Stage]]:
    """The jobs and stages of an event log, with their tasks' end events."""
    jobs: dict[int, Job] = {}
    stages: dict[int, Stage] = {}
    for event in log:
        kind = event["Event"]
        if kind == "SparkListenerJobStart":
            jobs[event["Job ID"]] = Job(event["Submission Time"], event["Stage IDs"])
        elif kind == "SparkListenerJobEnd" and event["Job ID"] in jobs:
            jobs[event["Job ID"]].ended = event["Completion Time"]
        elif kind == "SparkListenerStageCompleted":
            info = event["Stage Info"]
            stage = stages.setdefault(info["Stage ID"], Stage())
            stage.name = info["Stage Name"]
            stage.submitted = info.get("Submission Time")
            stage.completed = info.get("Completion Time")
        elif kind == "SparkListenerTaskEnd":
            stages.setdefault(event["Stage ID"], Stage()).tasks.append(event)
    return jobs, stages


def summary(jobs: dict[int, Job], stages: dict[int, Stage], last: int) -> dict[str, Any]:
    """The last ``last`` finished jobs: their durations, and per place in a job its stages'."""
    done = [jobs[j] for j in sorted(jobs) if jobs[j].ended is not None][-last:]
    by_place: dict[int, dict[str, list[float]]] = {}
    names: dict[int, str] = {}
    for job in done:
        ran = [stages[s] for s in sorted(job.stage_ids)
               if s in stages and stages[s].duration is not None]
        for place, stage in enumerate(ran):
            figures = by_place.setdefault(place, {"duration": [], "tasks": []})
            names.setdefault(place, stage.name)
            figures["duration"].append(float(stage.duration or 0))
            figures["tasks"].append(float(len(stage.tasks)))
            for name, read in TASK_FIGURES:
                figures.setdefault(f"task {name}", []).extend(read(t) for t in stage.tasks)
            assert stage.submitted is not None
            figures.setdefault("task scheduler delay", []).extend(
                t["Task Info"]["Launch Time"] - stage.submitted for t in stage.tasks)
    durations = [float((job.ended or job.started) - job.started) for job in done]
    return {
        "jobs": len(done),
        "job_ms": {"p50": percentile(durations, .5), "p99": percentile(durations, .99)},
        "stages": [{"place": place + 1, "name": names[place],
                    **{figure: {"p50": round(percentile(values, .5), 1),
                                "p99": round(percentile(values, .99), 1)}
                       for figure, values in figures.items()}}
                   for place, figures in sorted(by_place.items())],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("directory", type=Path, help="spark.eventLog.dir of the run")
    ap.add_argument("--last", type=int, default=60, help="jobs (micro-batches) summed up")
    ap.add_argument("--name", default=None, help="also write benchmarks/results/NAME.json")
    args = ap.parse_args()
    jobs, stages = parse(events(args.directory))
    if not jobs:
        raise SystemExit(f"no Spark jobs in {args.directory}: was the event log written there?")
    result = summary(jobs, stages, args.last)
    print(f"{result['jobs']} jobs: p50 {result['job_ms']['p50']:.0f} ms, "
          f"p99 {result['job_ms']['p99']:.0f} ms")
    for stage in result["stages"]:
        print(f"stage {stage['place']} ({stage['name']}):")
        for figure, q in stage.items():
            if isinstance(q, dict):
                print(f"  {figure:<22} p50 {q['p50']:8.1f}   p99 {q['p99']:8.1f}")
    if args.name:
        print(f"written to {save(args.name, {'directory': str(args.directory), **result})}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
