"""The processes of a stack, as the kernel sees them (through psutil).

A service is recorded by its pid and a *marker*, a string its command line contains,
so that a pid the kernel handed out again is never taken for ours nor signalled.
Two moments make a live process's command line read empty: a process that has just
``exec``'d (its parent may see the exec done before the kernel has set the new
arguments up) and one that is exiting. :func:`running` waits those out briefly, so a
service just started is never taken for one that died.
"""

from __future__ import annotations

import os
import time
from typing import Final

import psutil

#: How long an empty command line is read again before it is believed.
_EMPTY_S: Final = 0.5


def cmdline(pid: int) -> str:
    """``pid``'s command line, arguments joined by spaces; "" if it is gone or a zombie."""
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


def _state(pid: int) -> tuple[bool, str]:
    """Whether ``pid`` lives (not a zombie), and its command line."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False, ""
        return True, " ".join(process.cmdline())
    except psutil.Error:
        return False, ""


def running(pid: int, marker: str | None = None) -> bool:
    """Whether ``pid`` runs (not a zombie), with ``marker`` in its command line if given."""
    deadline = time.monotonic() + _EMPTY_S
    while True:
        live, line = _state(pid)
        if not live:
            return False
        if marker is None or marker in line:
            return True
        if line or time.monotonic() >= deadline:
            return False
        time.sleep(0.01)  # exec'ing or exiting: the kernel settles it in a moment


def session_members(sid: int) -> list[tuple[int, str]]:
    """Live (not zombie) processes of session ``sid``, with their command lines.

    A daemon's descendants stay in its session even when they move to a process group
    of their own (PySpark's daemon does), so the session finds them all.
    """
    members = []
    for process in psutil.process_iter(["status", "cmdline"]):
        try:
            if os.getsid(process.pid) != sid:
                continue
        except OSError:
            continue
        if process.info["status"] != psutil.STATUS_ZOMBIE:
            members.append((process.pid, " ".join(process.info["cmdline"] or ())))
    return members


def rss(pid: int) -> int:
    """Resident memory of ``pid`` in bytes; 0 if it is gone."""
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0
