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


class WriteRejected(IngestError):
    """An HTTP write refused before or while producing; carries the HTTP answer.

    Raised by :mod:`ingest.http`; the app that mounts the write routes maps it to its
    JSON error shape (``status``, ``code``, ``message``, ``field``, ``headers``).
    """

    def __init__(self, status: int, code: str, message: str, *, field: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.field = field
        self.headers = headers or {}
