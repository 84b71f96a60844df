"""The package as a user installs it: built from its source distribution, then installed in a
fresh virtual environment without extras, then with the ``kafka`` extra.

The suite's own environment has every extra installed, so an import that only an extra
satisfies (pandas once was) would pass everywhere else and break the first user.
"""

from __future__ import annotations

import json
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _run(*command: str | Path, timeout: float = 600) -> str:
    done = subprocess.run([str(part) for part in command], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT.parent)
    assert done.returncode == 0, (
        f"{' '.join(map(str, command))} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    )
    return done.stdout


def test_the_sdist_builds_a_wheel_that_installs_bare_and_with_the_kafka_extra(tmp_path):
    """The source distribution carries the Cython source and builds a wheel with the compiled
    engine on a machine with a C compiler (the build tools come from the package index); that
    wheel, installed in a fresh environment without extras, then with the kafka extra, runs.
    (One build of the engine serves every step: each build compiles it for half a minute.)"""
    import sys
    import zipfile

    sdist_dir, wheel_dir = tmp_path / "sdist", tmp_path / "wheels"
    _run(sys.executable, "-m", "build", "--sdist", "--outdir", sdist_dir, ROOT)
    (sdist,) = sdist_dir.glob("stream_svm-*.tar.gz")
    _run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
         "--disable-pip-version-check", "-w", wheel_dir, sdist)
    (wheel,) = wheel_dir.glob("stream_svm-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(name.startswith("stream_svm/_pathcore.") and name.endswith((".so", ".pyd"))
               for name in names), names

    environment = tmp_path / "venv"
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    command = environment / "bin" / "stream-svm"
    _run(python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", wheel)

    # Every library module imports without extras, the compiled engine among them.
    _run(python, "-c", "import stream_svm, stream_svm.alpha_isvm, stream_svm.lssvm, "
                       "stream_svm.datasets, stream_svm._pathcore; "
                       "print(stream_svm.IncrementalSVC().learn_one)")
    assert "evaluate" in _run(command, "--help")
    # The settings reference comes with the package (it lived only in the source tree).
    reference = _run(command, "settings")
    assert reference.startswith("# stream-svm daemon settings") and "\n[scaler]\n" in reference
    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps({"id": 1, "x": {"a": 1.0}, "y": True}) + "\n")
    summary = json.loads(_run(command, "evaluate", "--dataset", data, "--limit", "1"))
    assert summary["points"] == 1

    # The Kafka side needs its extra; the extra is enough for every command.
    missing = subprocess.run([str(command), "replay", "bananas", "--bootstrap-servers",
                              "127.0.0.1:1"], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2
    assert 'needs the kafka extra (missing module \'kafka\'): from the source ' \
        'checkout, pip install -e ".[kafka]"' in missing.stderr
    assert "Traceback" not in missing.stderr
    _run(python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         f"stream-svm[kafka] @ {wheel.as_uri()}")
    _run(python, "-c", "import connectors.daemon, connectors.broker, connectors.metrics")
    for subcommand in ("serve", "demo", "replay", "evaluate"):
        assert "usage" in _run(command, subcommand, "--help")
