"""`scrub` and `public_event`: a failure's detail stays with the operator, secrets with nobody."""

from __future__ import annotations

import string

from hypothesis import assume, given
from hypothesis import strategies as st

from handrail._redact import public_event, scrub

secrets = st.text(string.ascii_letters + string.digits + "_-", min_size=12, max_size=40)
prose = st.text(string.ascii_letters + " .,;()", max_size=40)


@given(prose, secrets, prose)
def test_a_key_in_any_wording_is_scrubbed(before: str, secret: str, after: str):
    assume(secret not in before and secret not in after)
    for shape in (
        f"sk-{secret}",
        f"Bearer {secret}",
        f"Authorization: Bearer {secret}",
        f"x-api-key: {secret}",
        f"api_key={secret}",
    ):
        text = scrub(f"{before} {shape} {after}")
        assert secret not in text
        assert "***" in text


def test_a_label_before_the_label_does_not_hide_the_key():
    # Found by the property above: "BEARER" before "Bearer k" made "Bearer" the scrubbed value.
    assert scrub("BEARER Bearer 000000000000 ") == "BEARER Bearer *** "
    assert scrub("token x-api-key: abcdef123") == "token x-api-key: ***"
    assert scrub("x-api-key: Bearer sk-abcdefghij") == "x-api-key: Bearer ***"


def test_only_an_errors_failure_is_replaced():
    interrupted = {
        "type": "run-failed",
        "reason": "interrupted",
        "error": "the run was interrupted",
    }
    assert public_event("s1", interrupted) is interrupted
    text = {"type": "text-delta", "agent": "a", "message_id": "m", "delta": "sk-0123456789abc"}
    assert public_event("s1", text) is text  # the model's own words are the tenant's to see
    failed = public_event(
        "s1", {"type": "run-failed", "reason": "error", "error": "StoreError: db at 10.0.0.7 down"}
    )
    assert failed["error"].startswith("StoreError: the turn failed (reference ")
    assert "10.0.0.7" not in failed["error"]
