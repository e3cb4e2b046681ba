"""A tiny webhook receiver: verifies tickler's Standard Webhooks signature and prints each delivery.

python examples/receiver.py --port 9000 --secret whsec_... [--count N]

With --count it exits after N deliveries (status 1 if a signature was bad, or if they did not all
come within --timeout seconds), so that a script can wait for it.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import time
from http.server import BaseHTTPRequestHandler, HTTPServer


def verified(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """The Standard Webhooks check: HMAC-SHA256 over "{id}.{timestamp}.{body}", fresh timestamp."""
    msg_id, timestamp = headers["webhook-id"], headers["webhook-timestamp"]
    if abs(time.time() - int(timestamp)) > 300:
        return False
    key = base64.b64decode(secret.removeprefix("whsec_"))
    expected = base64.b64encode(hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest())
    return any(
        hmac.compare_digest(sig.split(",", 1)[1].encode(), expected) for sig in headers["webhook-signature"].split()
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--secret", required=True, help="the queue's signing_secret (whsec_...)")
    parser.add_argument("--count", type=int, help="exit after this many deliveries")
    parser.add_argument("--timeout", type=float, default=60.0, help="with --count: give up after this long")
    args = parser.parse_args()
    seen = {"deliveries": 0, "bad": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            headers = {k.lower(): v for k, v in self.headers.items()}
            ok = verified(args.secret, headers, body)
            payload = json.loads(body)
            for event in payload["events"]:
                print(
                    f"{time.strftime('%H:%M:%S')} signature {'ok' if ok else 'BAD'}: {event['item_key']} "
                    f"due {event['schedule_on']} data={json.dumps(event['data'])}",
                    flush=True,
                )
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            seen["deliveries"] += 1
            seen["bad"] += not ok

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", args.port), Handler)
    print(f"receiver listening on http://127.0.0.1:{args.port}/", flush=True)
    if args.count is None:
        server.serve_forever()
        return
    server.timeout = 0.5  # handle_request() returns this often, to look at the clock
    deadline = time.monotonic() + args.timeout
    while seen["deliveries"] < args.count:
        if time.monotonic() > deadline:
            raise SystemExit(f"receiver: {seen['deliveries']} of {args.count} deliveries within {args.timeout:g} s")
        server.handle_request()
    server.server_close()
    if seen["bad"]:
        raise SystemExit(f"receiver: {seen['bad']} deliveries with a bad signature")


if __name__ == "__main__":
    main()
