from flask.testing import FlaskClient

from tests.conftest import auth


def test_schedule_and_read_back(client: FlaskClient, emails: str, token: str) -> None:
    response = client.post(
        "/v1/queues/emails/events",
        json={"item_key": "welcome:ana@example.com", "delay_seconds": 60, "data": {"name": "Ana"}},
        headers=auth(token),
    )
    assert response.status_code == 202
    assert response.json["outcome"] == "created"
    assert response.json["enqueued_by"] == "signup-service"
    got = client.get("/v1/queues/emails/events/welcome:ana@example.com", headers=auth(token))
    assert got.status_code == 200
    assert got.json["data"] == {"name": "Ana"}
    assert got.headers["ETag"] == '"1"'
