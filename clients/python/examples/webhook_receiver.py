"""A tickler webhook receiver on any WSGI server, verifying every delivery's signature.

    TICKLER_SIGNING_SECRET=whsec_... python clients/python/examples/webhook_receiver.py --port 9000

With Flask instead, the view is three lines:

    @app.post("/hooks")
    def hooks():
        try:
            delivery = verify_webhook(SECRET, request.headers, request.get_data())
        except WebhookVerificationError:
            return "", 401
        handle(delivery)
        return "", 204
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import make_server

from tickler_client import WebhookDelivery, WebhookVerificationError, verify_webhook


def print_delivery(delivery: WebhookDelivery) -> None:
    for event in delivery.events:
        print(f"{delivery.queue}: {event.item_key} due {event.schedule_on:%H:%M:%S} data={event.data}", flush=True)


def make_app(
    secret: str, handle: Callable[[WebhookDelivery], object] = print_delivery
) -> Callable[..., Iterable[bytes]]:
    """The WSGI app: 204 after `handle` returns, 401 for a bad signature (tickler then retries),
    and 500 when `handle` raises (a failed attempt, retried with the queue's backoff)."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        headers = {k[5:].replace("_", "-"): v for k, v in environ.items() if k.startswith("HTTP_")}
        try:
            delivery = verify_webhook(secret, headers, body)
        except WebhookVerificationError:
            start_response("401 Unauthorized", [("Content-Length", "0")])
            return [b""]
        handle(delivery)  # an exception here makes the server answer 500: a failed attempt
        start_response("204 No Content", [])
        return [b""]

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9000)
    args = parser.parse_args()
    server = make_server("127.0.0.1", args.port, make_app(os.environ["TICKLER_SIGNING_SECRET"]))
    print(f"receiving on http://127.0.0.1:{args.port}/", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
