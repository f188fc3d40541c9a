"""Progress bars: redrawn in a terminal, one line now and then in a log (ingest.progress)."""

from __future__ import annotations

import io

from ingest.progress import progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_in_a_log_each_shown_state_is_a_line_of_its_own():
    log = io.StringIO()
    with progress(total=5, desc="verify", unit="user", file=log, log_interval=0,
                  mininterval=0) as bar:
        for _ in range(5):
            bar.update()
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) >= 5 and all(line.startswith("verify:") for line in lines), lines
    assert "5/5" in lines[-1]


def test_in_a_log_the_lines_are_rate_limited_but_the_last_state_is_written():
    log = io.StringIO()
    with progress(total=1000, desc="replay", file=log, mininterval=0) as bar:
        for _ in range(1000):
            bar.update()
    lines = log.getvalue().splitlines()
    assert len(lines) == 2, lines  # the first state, then the closed bar's
    assert "0/1000" in lines[0] and "1000/1000" in lines[1]


def test_in_a_terminal_the_bar_is_redrawn_in_place():
    tty = Terminal()
    with progress(total=3, desc="verify", file=tty, mininterval=0) as bar:
        for _ in range(3):
            bar.update()
    assert tty.getvalue().count("\r") >= 3
