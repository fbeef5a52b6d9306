"""HTTP requests to an SGLang server, ``urllib`` only: the project's one JSON-over-HTTP client.

:func:`json_request`, :func:`get_json` and :func:`post_json` are the plain requests (the
benchmarks, the fleet step and the image tests use them); :class:`ServerClient` is mixed into
:class:`~sglang_rvv.launch.process.SGLangServer`, so a test says ``server.post(...)``; it
needs ``base_url`` and ``model_path``, and asks :meth:`ServerClient._failure_context` what to
add when a connection drops.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any


def json_request(url: str, body: Any = None) -> urllib.request.Request:
    """A request for ``url``: a POST of ``body`` as JSON, or a GET when ``body`` is None."""
    data = None if body is None else json.dumps(body).encode()
    return urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})


def get_json(url: str, timeout: float = 30) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


def post_json(url: str, body: Any, timeout: float = 120) -> Any:
    with urllib.request.urlopen(json_request(url, body), timeout=timeout) as response:
        return json.load(response)


class ServerError(RuntimeError):
    """The server failed to start, died, or answered a request with an error."""


class ServerClient:
    """``get``, ``post`` and ``completion`` against ``base_url``; a mixin (see the module)."""

    base_url: str
    model_path: str

    def _failure_context(self) -> str:
        """What a dropped connection's error adds: the server's state and its log."""
        raise NotImplementedError

    def _request(self, path: str, body: Any = None, timeout: float = 120.0) -> bytes:
        request = json_request(self.base_url + path, body)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise ServerError(f"{request.get_method()} {path} -> HTTP {exc.code}: {detail}") from exc
        except (ConnectionError, http.client.HTTPException) as exc:
            # A dropped connection says nothing by itself: name whether the server is still
            # up and quote its log, where a crash of the scheduler is explained.
            raise ServerError(
                f"{request.get_method()} {path}: {type(exc).__name__}: {exc}{self._failure_context()}"
            ) from exc

    def get(self, path: str, timeout: float = 30.0) -> Any:
        """``GET path``; the decoded JSON, or the text if the body is not JSON."""
        raw = self._request(path, timeout=timeout)
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def post(self, path: str, body: Any, timeout: float = 120.0) -> Any:
        """``POST path`` with a JSON body; the decoded JSON reply."""
        return json.loads(self._request(path, body, timeout=timeout))

    def completion(
        self, prompt: str | Sequence, max_tokens: int, temperature: float = 0.0, timeout: float = 120.0, **kw
    ) -> dict:
        """``POST /v1/completions``; extra keywords (``ignore_eos``, ``stop``, ...) go into the body."""
        body = {"model": self.model_path, "prompt": prompt, "max_tokens": max_tokens,
                "temperature": temperature, **kw}
        return self.post("/v1/completions", body, timeout=timeout)
