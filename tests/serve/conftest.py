"""The serve tests' servers stopped with ``tests.helpers.serving.stop_soon`` are joined at the end of each module."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module", autouse=True)
def _join_stopped_servers():
    yield
    from tests.helpers.serving import join_stopped

    join_stopped()
