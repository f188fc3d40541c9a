"""``benchmarks/tools/jfr_top.py`` counts a real Java Flight Recording's samples by thread and method."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks" / "tools"))

from jfr_top import by_thread, hot_methods, parse, read  # noqa: E402

#: Two threads of one pool spin in ``spin`` for a second of CPU each (not of the clock:
#: on a busy machine they would get less CPU than main compiling the class); main only
#: waits for them. ``spin`` calls itself twice before it loops: three frames of it in a
#: stack, which count once.
BUSY = """
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;

public class Busy {
    static long spin(long n, int deeper) {
        if (deeper > 0) { return spin(n, deeper - 1); }
        long x = 0;
        for (long i = 0; i < n; i++) { x += i * 31 ^ (x >>> 3); }
        return x;
    }
    public static void main(String[] args) throws Exception {
        Thread[] pool = new Thread[2];
        for (int t = 0; t < 2; t++) {
            pool[t] = new Thread(() -> {
                ThreadMXBean cpu = ManagementFactory.getThreadMXBean();
                long end = cpu.getCurrentThreadCpuTime() + 1_000_000_000L, s = 0;
                while (cpu.getCurrentThreadCpuTime() < end) { s += spin(100_000, 2); }
                System.out.println(s);
            }, "spinner-" + (t + 3));
            pool[t].start();
        }
        for (Thread t : pool) { t.join(); }
    }
}
"""


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> str:
    if shutil.which("jfr") is None or shutil.which("javac") is None:
        pytest.skip("needs a JDK's `jfr` and `javac` (Debian: openjdk-17-jdk-headless)")
    work = tmp_path_factory.mktemp("jfr")
    (work / "Busy.java").write_text(BUSY)
    out = work / "busy.jfr"
    subprocess.run(["java", f"-XX:StartFlightRecording=filename={out},settings=profile",
                    "Busy.java"], cwd=work, check=True, capture_output=True, timeout=120)
    return str(out)


def test_the_spinning_pool_is_the_busy_thread_and_spin_its_method(recording):
    samples = parse(read(recording, 16))
    threads = by_thread(samples)
    assert threads.most_common(1)[0][0] == "spinner-#", threads  # both threads, one pool
    total, methods = hot_methods(samples, "spinner")
    assert total == threads["spinner-#"] > 20
    # Once per stack, not per frame (three a stack). Not every sample's stack reaches
    # Thread.run: a busy CI machine once gave one of 240 without it.
    assert 0.9 * total <= methods["Busy.spin"] <= total, methods.most_common(5)
    assert methods["java.lang.Thread.run"] >= 0.9 * total, methods.most_common(5)


def test_a_stack_is_read_whole_and_without_arguments():
    text = """
jdk.ExecutionSample {
  startTime = 12:24:25.252
  sampledThread = "stateConnectionListenerThread" (javaThreadId = 239)
  state = "STATE_RUNNABLE"
  stackTrace = [
    java.lang.StringBuilder.append(char) line: 246
    net.razorvine.pickle.PickleUtils.rawStringFromBytes(byte[]) line: 292
    ...
  ]
}

jdk.ExecutionSample {
  startTime = 12:24:25.449
  sampledThread = "Executor task launch worker for task 1.0 in stage 7.0 (TID 12)" (javaThreadId = 241)
  state = "STATE_RUNNABLE"
  stackTrace = [
    java.lang.Thread.run() line: 833
  ]
}
"""
    assert parse(text) == [
        ("stateConnectionListenerThread",
         ["java.lang.StringBuilder.append", "net.razorvine.pickle.PickleUtils.rawStringFromBytes"]),
        ("Executor task launch worker for task #.# in stage #.# (TID #)", ["java.lang.Thread.run"]),
    ]
