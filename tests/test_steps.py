"""``make test``'s two steps (tests/steps.py): what each runs, and the low-weight group."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests import steps
from tests.plugins.workers import long_first
from tests.steps import NO_TESTS, LowWeightGroup, passed, stack_step, unit_step


def test_each_step_runs_its_half_of_the_suite_with_the_callers_arguments() -> None:
    assert unit_step(1, ["-k", "x"])[-4:] == ["--stacks", "without", "-k", "x"]
    assert "-n" not in unit_step(1, [])
    assert unit_step(2, [])[-5:] == ["-n", "2", "--dist", "loadfile", "--no-loadscope-reorder"]
    assert stack_step(["-x"])[-3:] == ["--stacks", "only", "-x"]
    assert passed(0) and passed(NO_TESTS) and not passed(1) and not passed(2)


def test_a_process_started_in_the_group_and_its_children_are_in_it_until_removed() -> None:
    try:
        group = LowWeightGroup.make()
    except OSError as exc:
        pytest.skip(f"no low-weight group here: {exc}")
    try:
        assert (group.path / group.weight_file).read_text().strip() == str(group.weight)
        child = subprocess.Popen(["sh", "-c", "sleep 30 & wait"], start_new_session=True,
                                 preexec_fn=group.enter)  # noqa: PLW1509
        try:
            members: set[str] = set()
            for _ in range(100):  # the shell's child appears once the shell has started it
                members = set((group.path / "cgroup.procs").read_text().split())
                if len(members) >= 2:
                    break
                time.sleep(0.05)
            assert str(child.pid) in members and len(members) >= 2, members
        finally:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    finally:
        group.remove()
    assert not group.path.exists()


def test_without_a_group_the_steps_run_one_after_the_other_and_none_selected_passes(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(steps, "V1_ROOT", tmp_path / "no-v1")
    monkeypatch.setattr(steps, "V2_ROOT", tmp_path / "no-v2")
    assert steps.run(1, ["-q", "-p", "no:cacheprovider", str(Path(__file__)),
                         "-k", "no_test_is_named_so"]) == 0
    said = capfd.readouterr().out
    assert "run one after the other" in said and "no cgroup cpu controller" in said, said
    assert said.index("== the tests without a whole stack") < said.index("== the whole-stack")


def test_the_unit_step_hands_out_the_long_modules_first_then_those_with_most_tests() -> None:
    modules = {"a.py": (False, 3), "b.py": (True, 1), "c.py": (False, 9), "d.py": (True, 2)}
    assert long_first(modules) == ["d.py", "b.py", "c.py", "a.py"]
