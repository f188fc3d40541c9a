"""``make test``: the whole-stack tests, and beside them, at a low CPU weight, the rest.

The suite has two steps (``--stacks``, :mod:`tests.plugins.workers`):

- the whole-stack tests (``pytest --stacks only``), one stack at a time in one process:
  on this 2-core box they keep it about half busy, since their scenarios wait out
  paced replays, network faults and restarts;
- the rest (``pytest --stacks without``), on two xdist workers: mostly CPU (about 550
  CPU-seconds), plus the view job's kill and outage tests on the session's nodes and
  brokers of their own (``tests/views/test_faults.py``, ``test_cluster.py``,
  ``test_outages.py``), which wait on JVM starts.

So the second step runs beside the first, in a CPU control group of its own whose
weight is an eighth of any other process group's. It takes the cores the stacks leave
idle; when a stack wants both cores, it gets all but an eighth of them. (Beside the
stacks at an equal weight, the same tests made a stack miss its timing windows: a
view built beside under load, a Cassandra node's restart.) A group, not ``nice``:
the kernel's autogroups weigh each session alike whatever its processes' nice, and
the tests' nodes run in sessions of their own.

Where no group can be made (no root, no cpu controller mounted), the steps run one
after the other, as the message says. Either way both run, and the exit status is 0
only when both passed; pytest's 5 ("no tests selected") counts as passed, so that
``PYTEST_ARGS`` may pick tests of one step only.

    python -m tests.steps [--workers N] [PYTEST_ARGS...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from ingest.retry import within

#: The second step's share of the CPU against one other process group at equal demand.
SHARE = 1 / 8
#: cgroup v1's cpu.shares and v2's cpu.weight of a group by default.
V1_DEFAULT, V2_DEFAULT = 1024, 100
V1_ROOT, V2_ROOT = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")
#: Seconds between two lines while the stack step is done and the other is not.
PROGRESS_S = 10.0
#: How long removing the group is tried while a process in it is still exiting.
REMOVE_S = 10.0
#: pytest's exit status when no test was selected.
NO_TESTS = 5


class LowWeightGroup:
    """A CPU control group with a low weight, made for one run and removed after it."""

    def __init__(self, path: Path, weight_file: str, weight: int) -> None:
        self.path, self.weight_file, self.weight = path, weight_file, weight

    @classmethod
    def make(cls) -> LowWeightGroup:
        """A new group under cgroup v2's root (whose children get the cpu controller, if
        they had not) or v1's cpu hierarchy; OSError if neither can be written."""
        name = f"fanout-tests-{os.getpid()}"
        if "cpu" in _read(V2_ROOT / "cgroup.controllers").split():
            if "cpu" not in _read(V2_ROOT / "cgroup.subtree_control").split():
                (V2_ROOT / "cgroup.subtree_control").write_text("+cpu")
            group = cls(V2_ROOT / name, "cpu.weight", max(1, round(V2_DEFAULT * SHARE)))
        elif (V1_ROOT / "cpu.shares").exists():
            group = cls(V1_ROOT / name, "cpu.shares", max(2, round(V1_DEFAULT * SHARE)))
        else:
            msg = f"no cgroup cpu controller at {V2_ROOT} (v2) or {V1_ROOT} (v1)"
            raise OSError(msg)
        group.path.mkdir()
        try:
            (group.path / group.weight_file).write_text(str(group.weight))
            subprocess.run(["true"], preexec_fn=group.enter, check=True)  # noqa: PLW1509
        except (OSError, subprocess.SubprocessError) as exc:  # a process cannot enter it
            group.remove()
            msg = f"{group.path}: {exc}"
            raise OSError(msg) from exc
        return group

    def enter(self) -> None:
        """Move the calling process into the group (its children follow it)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def remove(self) -> None:
        """Move what is left in the group to its parent, then remove the group.

        A process still exiting keeps the group busy for a moment (an empty group was
        once left behind): the removal is tried again for up to :data:`REMOVE_S`.
        """
        def attempt() -> None:
            for pid in _read(self.path / "cgroup.procs").split():
                with contextlib.suppress(OSError):
                    (self.path.parent / "cgroup.procs").write_text(pid)
            with contextlib.suppress(FileNotFoundError):
                self.path.rmdir()

        try:
            within(REMOVE_S, first=0.1, most=0.1,
                   transient=lambda exc: isinstance(exc, OSError))(attempt)
        except OSError:
            print(f"could not remove {self.path}; `rmdir` it once it is empty", flush=True)

    def __str__(self) -> str:
        return f"{self.path} ({self.weight_file} {self.weight})"


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _pytest(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", *args]


def unit_step(workers: int, args: list[str]) -> list[str]:
    """The tests without a whole stack, on ``workers`` pytest-xdist workers (1: none)."""
    spread = (["-n", str(workers), "--dist", "loadfile", "--no-loadscope-reorder"]
              if workers > 1 else [])  # the modules in tests.plugins.workers' order
    return _pytest("--stacks", "without", *spread, *args)


def stack_step(args: list[str]) -> list[str]:
    return _pytest("--stacks", "only", *args)


def passed(status: int) -> bool:
    return status in (0, NO_TESTS)


@contextlib.contextmanager
def _beside(command: list[str], group: LowWeightGroup) -> Iterator[subprocess.Popen[bytes]]:
    """``command`` in ``group``, its output to a file; killed with its session if the
    caller fails or is interrupted, and its output printed at the end either way."""
    with tempfile.TemporaryFile() as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True,
                                   preexec_fn=group.enter)  # noqa: PLW1509 (only writes a file)
        try:
            yield process
        finally:
            if process.poll() is None:  # interrupted: pytest's Ctrl-C stops its nodes
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGINT)
                try:
                    process.wait(120)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
            out.seek(0)
            print(f"\n== the tests without a whole stack (ran beside, in {group}):", flush=True)
            sys.stdout.buffer.write(out.read())
            sys.stdout.flush()


def _foreground(command: list[str]) -> int:
    """``command``'s exit status, waited for through Ctrl-C, then raised again.

    The terminal sends Ctrl-C to the step too, and pytest answers it by stopping what
    its tests started (stacks, nodes); ``subprocess.call`` would SIGKILL it meanwhile.
    """
    process = subprocess.Popen(command)
    interrupted = False
    while True:
        try:
            status = process.wait()
            break
        except KeyboardInterrupt:
            interrupted = True
    if interrupted:
        raise KeyboardInterrupt
    return status


def _wait(process: subprocess.Popen[bytes]) -> int:
    """Wait for ``process``, saying every :data:`PROGRESS_S` that it still runs."""
    began = time.monotonic()
    while True:
        try:
            return process.wait(PROGRESS_S)
        except subprocess.TimeoutExpired:
            print(f"  the tests without a whole stack still run: "
                  f"{time.monotonic() - began:.0f} s so far", flush=True)


def run(workers: int, args: list[str]) -> int:
    """Both steps, side by side where a low-weight group can be made; 0 if both passed."""
    try:
        group = LowWeightGroup.make()
    except OSError as exc:
        print(f"== the two steps run one after the other: a low-weight CPU group for the "
              f"second could not be made ({exc}); as root with a cgroup cpu controller "
              f"mounted, they run side by side", flush=True)
        print("== the tests without a whole stack", flush=True)
        unit = _foreground(unit_step(workers, args))
        print("== the whole-stack tests, one stack at a time", flush=True)
        stacks = _foreground(stack_step(args))
        return 0 if passed(unit) and passed(stacks) else 1
    try:
        print("== the whole-stack tests, one stack at a time; beside them, at an eighth "
              "of the CPU weight, the tests without a whole stack (their output follows "
              "the stacks')", flush=True)
        with _beside(unit_step(workers, args), group) as beside:
            stacks = _foreground(stack_step(args))
            unit = _wait(beside)
    finally:
        group.remove()
    print(f"== the whole-stack tests: {_said(stacks)}; the tests without a whole stack: "
          f"{_said(unit)}", flush=True)
    return 0 if passed(unit) and passed(stacks) else 1


def _said(status: int) -> str:
    return {0: "passed", NO_TESTS: "none selected"}.get(status, f"failed (exit {status})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.steps", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2,
                        help="pytest-xdist workers for the tests without a whole stack")
    known, rest = parser.parse_known_args(argv)
    try:
        return run(known.workers, rest)
    except KeyboardInterrupt:
        print("== interrupted: both steps stopped what they had started", flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(main())
