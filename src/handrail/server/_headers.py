"""Security headers on every answer: the page cannot be framed or sniffed, API answers not kept.

- `Content-Security-Policy`: the page's own scripts, styles and requests only, no framing
  (`frame-ancestors 'none'`, and `X-Frame-Options: DENY` for older browsers), no plug-ins, no
  `<base>`; so a same-site page cannot frame the signed-in page, and injected markup cannot
  run script.
- `X-Content-Type-Options: nosniff`: a body is what its type says.
- `Referrer-Policy: no-referrer`: the page's address (its `#key=` stays in the browser, but
  session ids do not) goes nowhere.
- `Cache-Control: no-store` on API answers (JSON), unless the answer sets its own: sessions
  and decisions are never kept by a cache on the way.
- `X-Request-ID`: every request gets an id (the client's own `X-Request-ID` when it is a
  short token, else a new one), which error bodies and the server's log lines name too.
"""

from __future__ import annotations

import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._random import token_hex

__all__ = ["CSP", "SecurityHeaders", "request_id", "security_headers"]

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'; "
    "object-src 'none'"
)
_ALWAYS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


def security_headers(scope: Scope) -> dict[str, str]:
    """The headers above, for an answer made outside the middleware (an unexpected error's)."""
    headers = {name.decode(): value.decode() for name, value in _ALWAYS}
    return {**headers, "x-request-id": request_id(scope), "cache-control": "no-store"}


_GIVEN_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


def request_id(scope: Scope) -> str:
    """The id of the request of `scope` (set by `SecurityHeaders`)."""
    return str(scope.get("state", {}).get("request_id", "-"))


class SecurityHeaders:
    """ASGI middleware that adds the headers above to every HTTP answer of `app`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = ""
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                text = value.decode("latin-1")
                rid = text if _GIVEN_ID.fullmatch(text) else ""
                break
        rid = rid or token_hex(6)
        scope.setdefault("state", {})["request_id"] = rid
        own = [(b"x-request-id", rid.encode())]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                json = caching = False
                for name, value in headers:  # the app's own: a few, lower-case (Starlette)
                    if name == b"content-type":
                        json = value.startswith(b"application/json")
                    elif name == b"cache-control":
                        caching = True
                headers += _ALWAYS
                headers += own
                if json and not caching:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
