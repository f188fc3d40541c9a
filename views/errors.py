"""Errors of the views package, rooted at one class."""


class ViewError(Exception):
    """Base of every error raised by the view job and the stores."""


class SourceError(ViewError):
    """The Kafka source could not read what it planned to read."""


class StoreError(ViewError):
    """A store could not apply or serve data."""


class BrokerUnreachable(SourceError):
    """The broker did not answer for longer than the job's retry budget."""


class OffsetsPastEnd(SourceError):
    """The checkpoint has read further than the topics now reach (data lost or recreated)."""
