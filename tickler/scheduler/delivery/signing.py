"""Standard Webhooks signatures (https://www.standardwebhooks.com): stock verifiers accept them.

signature = base64(HMAC-SHA256(secret, "{webhook-id}.{webhook-timestamp}.{body}")), sent as
`webhook-signature: v1,<signature>`; several space-separated while a secret is being rotated.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

SECRET_PREFIX = "whsec_"


def secret_bytes(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_bytes(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signature_header(secrets: list[str], message_id: str, timestamp: int, body: bytes) -> str:
    return " ".join(sign(secret, message_id, timestamp, body) for secret in secrets)


def verify(secret: str, headers: dict[str, str], body: bytes, *, now: int, tolerance: int = 300) -> bool:
    """Check a delivery as a receiver would (used by tickler's tests and examples)."""
    message_id = headers["webhook-id"]
    timestamp = int(headers["webhook-timestamp"])
    if abs(now - timestamp) > tolerance:
        return False
    expected = sign(secret, message_id, timestamp, body).split(",", 1)[1]
    for candidate in headers["webhook-signature"].split():
        version, _, value = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(value, expected):
            return True
    return False
