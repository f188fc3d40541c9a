"""What recording costs the load generator per request (it must not skew what it measures).

Prints the time of one ``Recorder.record`` (three HdrHistogram updates: latency,
service time, the timeline interval), and of draining and merging a worker report.
Run: ``.venv/bin/python benchmarks/bench_loadgen_recording.py``.
"""

import random
import time

from loadgen.recording import Recorder


def main(n: int = 200_000) -> None:
    rng = random.Random(0)
    values = [rng.lognormvariate(-6, 1) for _ in range(n)]
    rec = Recorder()
    start = time.perf_counter()
    for i, v in enumerate(values):
        at = 1000 + i * 0.001
        rec.record("GET home", due=at, done=at + v, latency=v, service=v, ok=True)
    per = (time.perf_counter() - start) / n
    start = time.perf_counter()
    payload = rec.drain()
    drained = time.perf_counter() - start
    start = time.perf_counter()
    Recorder().merge(payload)
    merged = time.perf_counter() - start
    print(f"record: {per * 1e6:.2f} µs/request; drain {drained * 1e3:.1f} ms and merge "
          f"{merged * 1e3:.1f} ms for {n:,} requests over {n // 1000} intervals")


if __name__ == "__main__":
    main()
