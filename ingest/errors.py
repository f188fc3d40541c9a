"""Errors of the ingest package, rooted at one class."""


class IngestError(Exception):
    """Base of every error raised by ingest."""


class InvalidEvent(IngestError):
    """A changelog record that breaks the contract; the message is the reason."""


class ProduceError(IngestError):
    """The broker did not acknowledge a record (after the producer's own retries)."""


class BrokerUnavailable(ProduceError):
    """No broker answered within the configured timeout."""


class InvalidToken(IngestError):
    """A consistency token this system did not issue, or one that was altered."""
