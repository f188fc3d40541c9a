"""Errors of the views package, rooted at one class."""


class ViewError(Exception):
    """Base of every error raised by the view job and the stores."""


class SourceError(ViewError):
    """The Kafka source could not read what it planned to read."""


class StoreError(ViewError):
    """A store could not apply or serve data."""
