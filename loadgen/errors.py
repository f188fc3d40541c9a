"""Errors of the loadgen package, rooted at one class."""


class LoadgenError(Exception):
    """Base of every error raised by loadgen."""


class WorkloadError(LoadgenError):
    """A workload description (mix, user range, workload or tokens file) is invalid."""


class ProbeError(LoadgenError):
    """The fan-out probe cannot run (no author with a follower, the API refuses posts)."""


class ReportError(LoadgenError):
    """Recorded results are missing or inconsistent, so no report can be made."""
