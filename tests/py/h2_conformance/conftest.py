"""The `rig` fixture: one app, the guard in front of it, and the clients of
one test, closed after it (and described when it failed)."""
import os

import pytest

from .harness import BIN, Rig


@pytest.fixture
def rig():
    assert os.access(BIN, os.X_OK), (
        f"no drainshim binary at {BIN}: run `cargo build --locked` or set DRAINSHIM_BIN")
    r = Rig()
    yield r
    # Shown by pytest only when the test failed.
    print(r.describe())
    r.close()
