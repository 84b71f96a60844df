from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The workplace's real data sets (not part of the project); skip when absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA} (it is not shipped with the project)")
    return SHARED_DATA
