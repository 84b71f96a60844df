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


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_in_pytest_basetemp(tmp_path_factory: pytest.TempPathFactory):
    """Temporary files of the suite, and of the processes it starts, go under pytest's own
    temporary directory (kept for the last three runs, then removed): an embedded broker that
    a test kills on purpose keeps its log, as a broker that died by itself should."""
    import os
    import tempfile

    directory = str(tmp_path_factory.mktemp("tmp"))
    before = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = directory, directory
    yield
    if before[0] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before[0]
    tempfile.tempdir = before[1]
