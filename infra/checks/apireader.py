"""The two reads the live verifier makes of the API: applied offsets, and a first page.

Split from :mod:`infra.checks.verifier`: an HTTP client with the user's own bearer token
(minted here, as any client holds one), whose reads carry ``X-Fanout-Monitor`` so that
sampling is not counted as the users' activity (DESIGN §4b). A read that gives no
answer to compare raises :class:`Unavailable`; a deleted account's 404 is the page's
answer.
"""

from __future__ import annotations

from typing import Any, Final

import httpx

from infra import webclient
from infra.checks.logtail import MEANING_TOPICS, LogicalTP
from infra.errors import InfraError
from serving.callers import MONITOR_HEADER, mint
from views.reference import HomeRow

#: Lifetime of the bearer tokens the verifier mints for its reads (seconds).
TOKEN_TTL: Final = 300


class Unavailable(InfraError):
    """The API did not give an answer to compare (down, degraded, or refused the read)."""


class ApiReader:
    """The two reads the verifier makes of the API: applied offsets, and a first page."""

    def __init__(self, url: str, secret: bytes | None, timeout: float = 5.0) -> None:
        self.url, self._secret, self._timeout = url.rstrip("/"), secret, timeout
        self._client: httpx.Client | None = None

    def _http(self) -> httpx.Client:
        if self._client is None:
            self._client = webclient.client(base_url=self.url, timeout=self._timeout)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def applied(self) -> dict[LogicalTP, int]:
        """The offsets the served store has applied, of the topics the view means."""
        body = self._get("/healthz", {})
        return {(topic, int(p)): int(o)
                for topic, parts in body.get("applied_offsets", {}).items()
                if topic in MEANING_TOPICS for p, o in parts.items()}

    def page(self, user: int, n: int) -> list[HomeRow] | str:
        """``user``'s first ``n`` entries as served, or why none were (a 404)."""
        headers = {MONITOR_HEADER: "1"}
        if self._secret is not None:
            headers["Authorization"] = f"Bearer {mint(user, self._secret, TOKEN_TTL)}"
        try:
            body = self._get(f"/v1/users/{user}/home", {"limit": n}, headers)
        except _NotFound as exc:
            return f"not served ({exc})"
        return [HomeRow(int(e["tweet_id"]), int(e["created_at"]), int(e["actor"]["id"]),
                        int(e["tweet"]["id"]), int(e["tweet"]["author"]["id"]))
                for e in body["entries"]]

    def _get(self, path: str, params: dict[str, Any],
             headers: dict[str, str] | None = None) -> dict[str, Any]:
        try:
            response = self._http().get(path, params=params, headers=headers)
        except httpx.HTTPError as exc:
            msg = f"GET {self.url}{path}: {exc}"
            raise Unavailable(msg) from exc
        if response.status_code == 404:
            msg = f"404: {response.text[:200]}"
            raise _NotFound(msg)
        if response.status_code != 200:
            msg = f"GET {self.url}{path} answered {response.status_code}: {response.text[:200]}"
            raise Unavailable(msg)
        try:
            result: dict[str, Any] = response.json()
        except ValueError as exc:
            msg = f"GET {self.url}{path} answered 200 with no JSON: {response.text[:200]}"
            raise Unavailable(msg) from exc
        return result


class _NotFound(InfraError):
    """A 404 (a deleted account's home), which :meth:`ApiReader.page` turns into its answer."""
