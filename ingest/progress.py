"""Progress bars that read well in a terminal and in a log.

tqdm redraws its bar in place with carriage returns. Piped into a file or a CI log,
that is one endless line of redraws (``fanout verify 2>&1 | tee verify.log``). So where
the stream is not a terminal, :func:`progress` writes the bar as a line of its own
at most every :data:`LOG_INTERVAL` seconds, and once more when it closes.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from tqdm import tqdm

#: Seconds between two progress lines in a log.
LOG_INTERVAL = 10.0


class LogLines:
    """A stream for tqdm that is not a terminal: one line per shown state, rate-limited."""

    def __init__(self, stream: TextIO, interval: float = LOG_INTERVAL) -> None:
        self.stream, self.interval = stream, interval
        self._latest = ""
        self._written = float("-inf")

    def write(self, text: str) -> None:
        shown = text.replace("\r", "").strip()
        if shown:
            self._latest = shown
        closing = text.endswith("\n")  # tqdm ends a closed bar with a newline
        now = time.monotonic()
        if self._latest and (closing or now - self._written >= self.interval):
            self.stream.write(self._latest + "\n")
            self._latest, self._written = "", now

    def flush(self) -> None:
        self.stream.flush()


def progress(*, file: TextIO | None = None, log_interval: float = LOG_INTERVAL,
             **kwargs: Any) -> tqdm:
    """A tqdm bar on ``file`` (stderr): redrawn in a terminal, a line now and then elsewhere."""
    stream = sys.stderr if file is None else file
    isatty = getattr(stream, "isatty", None)
    if isatty is None or not isatty():
        kwargs.setdefault("ascii", True)  # a log may not be UTF-8
        return tqdm(file=LogLines(stream, log_interval), **kwargs)
    return tqdm(file=stream, **kwargs)
