from __future__ import annotations

import pytest

from tests.ops.wheel import build_wheel


@pytest.fixture(scope="session")
def memq_wheel(tmp_path_factory):
    """The wheel of this checkout (pip wheel --no-deps), built once for the session."""
    return build_wheel(tmp_path_factory.mktemp("whl"))
