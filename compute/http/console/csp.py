"""The console's Content-Security-Policy: its pages load and call only this site (no inline
script, no other origin, no framing), so injected markup cannot run or send data away."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
          "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; "
          "object-src 'none'")


def content_security_policy(get_response: Callable[[HttpRequest], HttpResponse]
                            ) -> Callable[[HttpRequest], HttpResponse]:
    """Middleware: the policy on every console page."""

    def middleware(request: HttpRequest) -> HttpResponse:
        response = get_response(request)
        if request.path.startswith("/console"):
            response.headers.setdefault("Content-Security-Policy", POLICY)
        return response

    return middleware
