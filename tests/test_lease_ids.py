"""Lease ids in paths are parsed once, into the form the database reads: every spelling Python's
UUID accepts works, and anything else is a stale lease (409), never a database refusal."""

from __future__ import annotations

import pytest
from flask.testing import FlaskClient

from tests.conftest import auth
from tests.helpers import schedule

UNKNOWN = "12345678-1234-5678-1234-567812345678"


@pytest.mark.parametrize("spelling", [f"urn:uuid:{UNKNOWN}", f"{{{UNKNOWN}}}", UNKNOWN.replace("-", ""), "nope"])
@pytest.mark.parametrize("action", ["ack", "nack", "extend"])
def test_an_unknown_lease_in_any_spelling_is_stale(
    client: FlaskClient, emails: str, admin_token: str, spelling: str, action: str
) -> None:
    body = {"error": "boom", "seconds": 5}
    response = client.post(f"/v1/leases/{spelling}/{action}", json=body, headers=auth(admin_token))
    assert response.status_code == 409, response.get_data(as_text=True)


def test_a_lease_acked_by_its_urn_is_delivered(client: FlaskClient, emails: str, admin_token: str) -> None:
    assert schedule(client, admin_token, "k").status_code == 202
    claimed = client.post("/v1/queues/emails/claims", json={"worker": "w"}, headers=auth(admin_token)).json
    assert claimed is not None
    lease_id = claimed["leases"][0]["lease_id"]
    response = client.post(f"/v1/leases/urn:uuid:{lease_id.upper()}/ack", headers=auth(admin_token))
    assert response.status_code == 200 and response.json == {"lease_id": lease_id, "status": "delivered"}
