"""The README's Python examples run as written, and print what the README says they print."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
TEXT = README.read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", TEXT, flags=re.S)
#: The address the examples that talk to Kafka give (a running `stream-svm serve`'s broker).
KAFKA_ADDRESS = "127.0.0.1:9092"
KAFKA_BLOCKS = [block for block in BLOCKS if KAFKA_ADDRESS in block]
LIBRARY_BLOCKS = [block for block in BLOCKS if KAFKA_ADDRESS not in block]


def test_readme_has_examples():
    assert len(LIBRARY_BLOCKS) >= 2 and len(KAFKA_BLOCKS) == 1


@pytest.mark.parametrize("index", range(len(LIBRARY_BLOCKS)))
def test_readme_example_runs(index, capsys):
    block = LIBRARY_BLOCKS[index]
    exec(compile(block, f"README.md block {index}", "exec"), {})
    out = capsys.readouterr().out
    assert out.strip()
    # What a print's comment says it prints ("# Accuracy: 89.04%"; "A, then B": both).
    for said in re.findall(r"^print\(.*\)  # (.+)$", block, flags=re.M):
        for part in said.split(", then "):
            assert part in out, f"README block {index} says {part!r}; it printed {out!r}"


@pytest.mark.broker
def test_readme_kafka_example_prints_what_the_readme_says(tmp_path, capsys):
    from connectors.broker import EmbeddedBroker
    from connectors.config import load_config
    from connectors.daemon import Daemon

    said = re.search(r"It prints `([^`]+)` \([^)]*\) and `([^`]+)`", TEXT)
    assert said, "the README says what the Kafka example prints"
    # Its own broker: the example uses the daemon's default topic names.
    with EmbeddedBroker(start_timeout=20) as broker:
        config = load_config(None, {"kafka.bootstrap_servers": broker.bootstrap_servers,
                                    "checkpoint.dir": str(tmp_path / "checkpoints"),
                                    "metrics.enabled": False}, environ={})
        daemon = Daemon(config)
        thread = threading.Thread(target=daemon.run, daemon=True)
        thread.start()
        try:
            # As the README has it: the daemon runs (its topics made) before messages come.
            deadline = time.monotonic() + 60
            while not (daemon._consumer is not None and daemon._consumer.assignment()):
                assert time.monotonic() < deadline and thread.is_alive(), "no start"
                time.sleep(0.1)
            block = KAFKA_BLOCKS[0].replace(KAFKA_ADDRESS, broker.bootstrap_servers)
            exec(compile(block, "README.md Kafka example", "exec"), {})
        finally:
            daemon.stop()
            thread.join(timeout=60)
    assert capsys.readouterr().out.splitlines() == [said.group(1), " ".join(
        said.group(2).split())]
