"""What an uncaught error of the Python client says (its str(), which a traceback prints): the
status, the title once, and each refused field with its reasons, from a real server's answer."""

from __future__ import annotations

import pytest
from tickler_client import Client, NotFound, ValidationError


def test_an_uncaught_validation_error_names_each_field_and_its_reason(tickler: Client) -> None:
    with pytest.raises(ValidationError) as caught:
        tickler.schedule("emails", "welcome:ana@example.com", data={}, delay=-1)
    error = caught.value
    assert error.status == 400 and "delay_seconds" in error.errors
    text = str(error)
    assert text.startswith(f"400 {error.title}") and text.count(error.title) == 1, text
    for field, messages in error.errors.items():
        assert f"{field}: {' '.join(messages)}" in text, text


def test_other_errors_keep_the_title_and_the_detail(tickler: Client) -> None:
    with pytest.raises(NotFound) as caught:
        tickler.get("emails", "never-seen")
    error = caught.value
    assert str(error) == f"404 {error.title}: {error.detail}"
    assert ValidationError("a naive datetime", errors={"schedule_on": ["Needs a timezone."]}).__str__() == (
        "a naive datetime: schedule_on: Needs a timezone."
    )
