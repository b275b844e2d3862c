"""The lifecycle on a sandbox playing each Datadog quirk (gpufarm_sandbox.emulator.quirks), and all of them at once.

Each quirk is one other plausible way the real service may behave where its documentation is silent: rules that fire
only on state changes, `$INCIDENT_FIELDS` as a string, header variables left unsubstituted, custom-field facets
refused or ignored, the host list's source named `User`, no wildcard inside a list value. The same tests as on the
plain sandbox (test_lifecycle_local) must pass: webhooks are a fast path, the sweep completes every step
(gpufarm.core.sync.sweep), searches fall back (gpufarm.adapters.incident_search), tag sources match in any case.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_lifecycle_local import (
    test_a_full_pool_waits_and_allocates_when_a_release_frees_capacity,
    test_beyond_quota_an_operator_approves_by_click_and_others_cannot,
    test_expiry_reclaims_through_the_scheduled_sync,
    test_request_within_quota_is_allocated_and_release_reclaims,
    test_resolving_in_the_datadog_ui_reclaims,
    test_webhook_with_a_wrong_token_is_401_and_changes_nothing,
)

from gpufarm_sandbox.emulator.quirks import QUIRKS
from gpufarm_sandbox.localhost import LocalEnv, start_local

__all__ = [
    "test_a_full_pool_waits_and_allocates_when_a_release_frees_capacity",
    "test_beyond_quota_an_operator_approves_by_click_and_others_cannot",
    "test_expiry_reclaims_through_the_scheduled_sync",
    "test_request_within_quota_is_allocated_and_release_reclaims",
    "test_resolving_in_the_datadog_ui_reclaims",
    "test_webhook_with_a_wrong_token_is_401_and_changes_nothing",
]


@pytest.fixture(scope="module", params=[*QUIRKS, "all"])
def local(request: pytest.FixtureRequest) -> Iterator[LocalEnv]:
    """The local host on a sandbox playing one quirk (or all of them)."""
    with start_local(port=0, quirks=request.param) as env:
        yield env
