"""Resilience of ``stream-svm serve`` as a real process: SIGTERM and SIGINT in the middle of a
stream, a broker that is unreachable at start, a broker lost mid-run, and the embedded broker
that ``serve`` starts itself when no bootstrap servers are configured.

Every daemon and broker runs on 127.0.0.1, every wait is bounded, and every process started
here (including a Tansu child of a daemon) is killed in teardown if a test fails."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pytest

from connectors.broker import EmbeddedBroker, free_loopback_port
from connectors.checkpoint import CheckpointStore
from connectors.daemon import ensure_topics
from stream_svm import IncrementalSVC
from tests.connectors_helpers import (  # noqa: F401
    broker,
    committed,
    produce,
    read_all,
    unique,
    wait_for,
)

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[1]


# -- helpers --------------------------------------------------------------------------------


def _stream(n: int, seed: int) -> list[dict[str, Any]]:
    """Labelled points and, every 7th, an unlabelled one (predicted, not learned): each
    message has exactly one output, so offsets and outputs can be matched one to one."""
    rng = np.random.default_rng(seed)
    messages: list[dict[str, Any]] = []
    for i, (a, b) in enumerate(rng.uniform(-2, 2, size=(n, 2))):
        message: dict[str, Any] = {"id": i, "x": {"a": float(a), "b": float(b)}}
        if i % 7 != 6:
            message["y"] = bool(a * b > 0)
        messages.append(message)
    return messages


def _labelled_ids(messages: list[dict[str, Any]]) -> list[int]:
    return sorted(m["id"] for m in messages if "y" in m)


def _topics(prefix: str) -> dict[str, str]:
    return {k: unique(f"{prefix}-{k}") for k in ("input", "output", "dead")}


def _write_config(
    path: Path,
    servers: str | None,
    topics: dict[str, str],
    checkpoints: Path,
    *,
    kafka: dict[str, Any] | None = None,
    checkpoint: dict[str, Any] | None = None,
    retry: dict[str, Any] | None = None,
) -> Path:
    """A TOML file for ``serve``; ``servers`` None leaves bootstrap_servers unset (embedded)."""
    settings: dict[str, dict[str, Any]] = {
        "kafka": {
            "input_topic": topics["input"],
            "output_topic": topics["output"],
            "dead_letter_topic": topics["dead"],
            "group_id": unique("resilience-group"),
            **({"bootstrap_servers": servers} if servers is not None else {}),
            **(kafka or {}),
        },
        "model": {"C": 1.0, "gamma": 0.5},
        "checkpoint": {"dir": str(checkpoints), **(checkpoint or {})},
        # No metrics server: a fixed port would clash between tests and with other runs.
        "metrics": {"enabled": False},
        "retry": retry or {},
    }
    lines: list[str] = []
    for section, values in settings.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _proc_stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a live process from /proc, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the name may hold spaces and parentheses
    if fields[0] == "Z":  # a zombie has exited already
        return None
    return int(fields[1]), int(fields[19])


def _children(pid: int) -> dict[int, int]:
    """Direct children of ``pid``: {child pid: start time} (psutil is not installed)."""
    found: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _proc_stat(int(entry.name))
            if stat is not None and stat[0] == pid:
                found[int(entry.name)] = stat[1]
    return found


def _same_process_alive(pid: int, started: int) -> bool:
    stat = _proc_stat(pid)
    return stat is not None and stat[1] == started  # a reused pid has another start time


class Serve:
    """``stream-svm serve`` as a subprocess, its stdout and stderr in one log file. On exit
    it is killed if still running, and so are its children (an embedded Tansu broker is one,
    in its own session: killing the daemon alone would orphan it)."""

    def __init__(self, config: Path, log: Path, *extra: str) -> None:
        self.log_path = log
        command = [sys.executable, "-m", "connectors.cli", "--log-level", "INFO", "serve",
                   "--config", str(config), *extra]
        with open(log, "ab") as handle:
            self.process = subprocess.Popen(
                command,
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
            )
        self.children: dict[int, int] = {}

    def __enter__(self) -> Serve:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self.process.poll() is None:
            self.children.update(_children(self.process.pid))
            self.process.kill()
            self.process.wait(timeout=10)
        for pid, started in self.children.items():
            if _same_process_alive(pid, started):
                os.kill(pid, signal.SIGKILL)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.text().splitlines()[-lines:])

    def wait_log(self, pattern: str, timeout: float, count: int = 1,
                 after: int = 0) -> list[re.Match[str]]:
        """The first ``count`` matches of ``pattern`` in the log past character ``after``;
        fails when the daemon exits or ``timeout`` seconds pass first."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            matches = list(regex.finditer(self.text(), after))
            if len(matches) >= count:
                return matches[:count]
            if not self.alive:
                pytest.fail(f"serve exited ({self.process.returncode}) before logging "
                            f"{count} x {pattern!r}:\n{self.tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {count} x {pattern!r} within {timeout} s:\n{self.tail()}")
            time.sleep(0.05)

    def signal(self, signum: int, timeout: float) -> int:
        """Send ``signum``; the exit code once the process exits within ``timeout`` s."""
        self.process.send_signal(signum)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"serve did not exit within {timeout} s of signal {signum}:\n"
                        f"{self.tail()}")


class Outputs:
    """Follows the output topic; ``offsets()`` are the input offsets answered so far."""

    def __init__(self, servers: str, topic: str) -> None:
        from kafka import KafkaConsumer, TopicPartition

        # A short fetch wait: the daemon answers ~1000 messages a second, so a lagging
        # watcher would report progress long after the fact.
        self.consumer = KafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False,
                                      fetch_max_wait_ms=10)
        self.consumer.assign([TopicPartition(topic, 0)])
        self.consumer.seek_to_beginning()
        self.seen: set[int] = set()

    def offsets(self) -> set[int]:
        for records in self.consumer.poll(timeout_ms=50).values():
            self.seen.update(json.loads(r.value)["source"]["offset"] for r in records)
        return self.seen

    def close(self) -> None:
        self.consumer.close()


class Feeder:
    """Produces the messages in small bursts on a thread until ``finish()``: the stream is
    still flowing whenever a test signals the daemon, however fast the daemon is."""

    def __init__(self, servers: str, topic: str, messages: list[dict[str, Any]],
                 burst: int = 8, pause: float = 0.05) -> None:
        self.servers, self.topic, self.messages = servers, topic, messages
        self.burst, self.pause = burst, pause
        self.sent = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="feeder", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=self.servers, acks="all", linger_ms=1)
        try:
            while self.sent < len(self.messages) and not self._stop.is_set():
                chunk = self.messages[self.sent : self.sent + self.burst]
                for message in chunk:
                    producer.send(self.topic, value=json.dumps(message).encode())
                producer.flush(timeout=30)
                self.sent += len(chunk)
                self._stop.wait(self.pause)
        except BaseException as exc:  # reported by finish()
            self.error = exc
        finally:
            producer.close(timeout=10)

    @property
    def flowing(self) -> bool:
        return self._thread.is_alive() and self.sent < len(self.messages)

    def finish(self) -> int:
        """Stop producing; how many messages were sent (all flushed)."""
        self._stop.set()
        self._thread.join(timeout=40)
        assert not self._thread.is_alive(), "the feeder did not stop"
        assert self.error is None, self.error
        return self.sent


def _wait_progress(serve: Serve, outputs: Outputs, condition: Callable[[set[int]], bool],
                   timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition(outputs.offsets()):
        if not serve.alive:
            pytest.fail(f"serve exited ({serve.process.returncode}):\n{serve.tail()}")
        if time.monotonic() > deadline:
            pytest.fail(f"no progress within {timeout} s ({len(outputs.seen)} outputs):\n"
                        f"{serve.tail()}")


def _read_to_end(servers: str, topic: str, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Every message of a finished topic: read up to its end offsets, not until some idle
    time (a cold consumer can be silent for a second and then cut the list short)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p)
                      for p in sorted(consumer.partitions_for_topic(topic) or ())]
        assert partitions, f"topic {topic} not found"
        consumer.assign(partitions)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(partitions)
        found: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            assert time.monotonic() < deadline, f"{topic} not read to {ends} in {timeout} s"
            for records in consumer.poll(timeout_ms=200).values():
                found += [json.loads(r.value) for r in records]
        return found
    finally:
        consumer.close()


def _output_offsets(servers: str, topic: str) -> list[int]:
    """Input offsets of every output in the topic, sorted, repeats kept."""
    return sorted(o["source"]["offset"] for o in _read_to_end(servers, topic))


def _next_offset(checkpoints: Path, topic: str) -> int:
    checkpoint = CheckpointStore(checkpoints).load_latest()
    assert checkpoint is not None, f"no checkpoint in {checkpoints}"
    return int(checkpoint.state["processor"]["offsets"][f"{topic}:0"])


def _assert_model_learned_each_once(checkpoints: Path, messages: list[dict[str, Any]]) -> None:
    """The restored model holds every labelled id exactly once: a message learned twice
    would either be a second stored point or (same id) a dead letter, checked elsewhere."""
    checkpoint = CheckpointStore(checkpoints).load_latest()
    assert checkpoint is not None
    model = IncrementalSVC.from_checkpoint(checkpoint.arrays, checkpoint.model_meta)
    labelled = _labelled_ids(messages)
    assert model.n_stored == len(labelled)
    assert sorted(model.stored_keys()) == labelled


RETRY_LINE = (r"WARNING connectors\.daemon: broker at {servers} unreachable \(attempt (\d+)\): "
              r".*{servers}.*; retrying in ([0-9.]+) s")


# -- 1. SIGTERM and SIGINT mid-stream -------------------------------------------------------


@pytest.mark.slow
def test_sigterm_and_sigint_mid_stream_stop_cleanly_and_resume(broker, tmp_path):  # noqa: F811
    """Each signal, sent while the stream is still being produced: exit 0 promptly, a
    checkpoint whose next offset N is exactly the set of answered inputs (0..N-1, each once),
    N committed; the restart resumes at N. Periodic checkpoints are off, so the checkpoints
    can only come from the shutdown path."""
    servers = broker.bootstrap_servers
    topics = _topics("signals")
    ensure_topics({"bootstrap_servers": servers}, list(topics.values()))
    checkpoints = tmp_path / "checkpoints"
    config = _write_config(
        tmp_path / "serve.toml", servers, topics, checkpoints,
        kafka={"max_batch": 4, "request_timeout_ms": 5000},
        checkpoint={"every_messages": 10**6, "every_seconds": 10**6},
    )
    group = re.search(r'group_id = "([^"]+)"', config.read_text()).group(1)
    messages = _stream(3000, seed=21)  # more than the feeder gets to send
    feeder = Feeder(servers, topics["input"], messages)
    outputs = Outputs(servers, topics["output"])
    try:
        answered = 0
        for signum in (signal.SIGTERM, signal.SIGINT):
            with Serve(config, tmp_path / f"serve-{signum.name}.log") as serve:
                _wait_progress(serve, outputs, lambda seen, a=answered: len(seen) >= a + 60, 60)
                assert feeder.flowing, "the stream ended before the signal"
                assert serve.signal(signum, timeout=20) == 0, serve.tail()
            text = serve.text()
            assert "stopping: finishing the batch, flushing, checkpointing, committing" in text
            assert re.search(r"connectors\.daemon: stopped: \{.*\"exit_code\": 0\}", text)
            assert "Traceback" not in text
            stopped_at = _next_offset(checkpoints, topics["input"])
            assert stopped_at >= answered + 60
            # Exactly the inputs below the checkpointed offset are answered, none twice and
            # none beyond it: the batch was finished and flushed, and nothing else read.
            assert _output_offsets(servers, topics["output"]) == list(range(stopped_at))
            assert committed(servers, group, topics["input"]) == stopped_at
            answered = stopped_at
        sent = feeder.finish()
        assert sent > answered

        with Serve(config, tmp_path / "serve-drain.log", "--until-drained") as serve:
            assert serve.process.wait(timeout=120) == 0, serve.tail()
    finally:
        feeder.finish()
        outputs.close()
    # The restart resumed at the checkpoint: every input answered exactly once overall.
    assert _output_offsets(servers, topics["output"]) == list(range(sent))
    assert _read_to_end(servers, topics["dead"]) == []  # no "already learned" either
    _assert_model_learned_each_once(checkpoints, messages[:sent])
    assert _next_offset(checkpoints, topics["input"]) == sent


# -- 2. The broker unreachable at start ------------------------------------------------------


def test_unreachable_broker_at_start_is_retried_until_it_comes(tmp_path):
    """Nothing listens on the port: the daemon stays up and logs retry lines naming the
    servers and the (doubling) delay; once a broker starts on that port it connects, answers
    the stream, and stops with exit 0 on SIGTERM."""
    port = free_loopback_port()
    servers = f"127.0.0.1:{port}"
    topics = _topics("unreachable")
    checkpoints = tmp_path / "checkpoints"
    config = _write_config(
        tmp_path / "serve.toml", servers, topics, checkpoints,
        kafka={"request_timeout_ms": 1500},  # one connection attempt gives up after 1.5 s
        retry={"initial_backoff_seconds": 0.3, "max_backoff_seconds": 5.0},
    )
    with Serve(config, tmp_path / "serve.log") as serve:
        pattern = RETRY_LINE.format(servers=re.escape(servers))
        lines = serve.wait_log(pattern, timeout=30, count=2)
        assert [int(m.group(1)) for m in lines] == [1, 2]
        assert [float(m.group(2)) for m in lines] == [0.3, 0.6]
        assert serve.alive
        assert "Traceback" not in serve.text()

        with EmbeddedBroker(port=port, start_timeout=20):
            serve.wait_log(rf"connected to {re.escape(servers)}: reading {topics['input']}\[0\]",
                           timeout=30)
            messages = _stream(30, seed=5)
            produce(servers, topics["input"], messages)
            answered = read_all(servers, topics["output"], expected=len(messages), timeout=30)
            assert sorted(o["source"]["offset"] for o in answered) == list(range(len(messages)))
            assert serve.signal(signal.SIGTERM, timeout=20) == 0, serve.tail()
    assert _next_offset(checkpoints, topics["input"]) == len(messages)


def test_sigterm_while_the_broker_is_unreachable_at_start(tmp_path):
    """A stop during the connection retries exits 0 within one connection attempt (bounded
    by request_timeout_ms), without a checkpoint since nothing was processed."""
    servers = f"127.0.0.1:{free_loopback_port()}"
    checkpoints = tmp_path / "checkpoints"
    config = _write_config(
        tmp_path / "serve.toml", servers, _topics("unreachable-stop"), checkpoints,
        kafka={"request_timeout_ms": 1500},
        retry={"initial_backoff_seconds": 0.3, "max_backoff_seconds": 1.0},
    )
    with Serve(config, tmp_path / "serve.log") as serve:
        serve.wait_log(RETRY_LINE.format(servers=re.escape(servers)), timeout=30)
        started = time.monotonic()
        assert serve.signal(signal.SIGTERM, timeout=15) == 0, serve.tail()
        assert time.monotonic() - started < 1.5 + 5  # one attempt + exit
    assert CheckpointStore(checkpoints).paths() == []


# -- 3. The broker lost mid-run --------------------------------------------------------------


@pytest.mark.slow
def test_broker_lost_mid_stream(tmp_path):
    """The broker is killed in the middle of a backlog (the daemon frozen meanwhile by
    SIGSTOP). The daemon stays up, logging a retry line per failed delivery. As documented
    (Daemon, _deliver): a first SIGTERM keeps waiting for the broker (no output may be lost),
    a second one gives the undelivered outputs up and exits 1 without writing a checkpoint
    past them. Back on a broker with the same stream, the restart repeats the stream from the
    last checkpoint and learns nothing twice."""
    topics = _topics("lost")
    checkpoints = tmp_path / "checkpoints"
    messages = _stream(3000, seed=8)  # a backlog: the daemon holds fetched records at the kill
    request_timeout = 1.0
    # (Killed below: a log of its own would be kept, in $TMPDIR, as a broker's that died.)
    embedded = EmbeddedBroker(start_timeout=20, log_file=tmp_path / "broker.log")
    try:
        embedded.start()
        servers = embedded.bootstrap_servers
        ensure_topics({"bootstrap_servers": servers}, list(topics.values()))
        produce(servers, topics["input"], messages)
        config = _write_config(
            tmp_path / "serve.toml", servers, topics, checkpoints,
            kafka={"max_batch": 1, "request_timeout_ms": int(request_timeout * 1000)},
            checkpoint={"every_messages": 40, "every_seconds": 10**6},
            retry={"initial_backoff_seconds": 0.2, "max_backoff_seconds": 0.4},
        )
        store = CheckpointStore(checkpoints)
        with Serve(config, tmp_path / "serve.log") as serve:
            outputs = Outputs(servers, topics["output"])
            try:
                _wait_progress(serve, outputs, lambda seen: len(seen) >= 100, 60)
                # Frozen in the middle of the backlog while the broker goes, so that it is
                # certainly holding records it has not answered when it wakes up.
                serve.process.send_signal(signal.SIGSTOP)
            finally:
                outputs.close()
            try:
                assert wait_for(lambda: bool(store.paths()), 10)
                assert embedded.process is not None
                embedded.process.kill()  # lost, not stopped: no goodbye to the clients
                embedded.process.wait(timeout=10)
            finally:
                serve.process.send_signal(signal.SIGCONT)

            failures = serve.wait_log(r"could not deliver \d+ outputs \(attempt (\d+)\): "
                                      r".*; retrying in [0-9.]+ s", timeout=30, count=2)
            assert [int(m.group(1)) for m in failures] == [1, 2]
            assert serve.alive
            # The daemon is stuck on one undelivered batch: it cannot have checkpointed since.
            last_checkpoint = store.paths()[-1]
            resumes_at = _next_offset(checkpoints, topics["input"])
            assert 40 <= resumes_at < len(messages)

            serve.process.send_signal(signal.SIGTERM)
            stopping = serve.wait_log(r"connectors\.daemon: stopping: ", timeout=10)[0].end()
            serve.wait_log(r"could not deliver \d+ outputs", timeout=20, count=2, after=stopping)
            assert serve.alive, "a first SIGTERM must not drop outputs the broker did not take"

            started = time.monotonic()
            assert serve.signal(signal.SIGTERM, timeout=3 * request_timeout + 10) == 1
            assert time.monotonic() - started < 3 * request_timeout + 10
            text = serve.text()
            assert "gave up delivering" in text and '"exit_code": 1' in text
            assert store.paths()[-1] == last_checkpoint, "checkpointed undelivered outputs"

        # The same stream on a new broker at the same address. The recreated topic is
        # noticed (its id changed) and the daemon refuses to resume there on its own; told that
        # it holds the same messages at the same offsets, the restart answers the inputs from
        # the checkpoint on (the given-up batch included), each once.
        embedded.stop()
        embedded = EmbeddedBroker(port=int(servers.rpartition(":")[2]), start_timeout=20)
        embedded.start()
        ensure_topics({"bootstrap_servers": servers}, list(topics.values()))
        produce(servers, topics["input"], messages)
        with Serve(config, tmp_path / "serve-refused.log", "--until-drained") as serve:
            assert serve.process.wait(timeout=60) == 1, serve.tail()
        assert "no longer holds the offsets this model resumes from" in serve.text()
        assert _output_offsets(servers, topics["output"]) == []
        with Serve(config, tmp_path / "serve-drain.log", "--until-drained",
                   "--on-partition-reset", "resume", "--set", "kafka.max_batch=200") as serve:
            assert serve.process.wait(timeout=90) == 0, serve.tail()
        answered = _output_offsets(servers, topics["output"])
        assert answered == list(range(resumes_at, len(messages)))
        assert _read_to_end(servers, topics["dead"]) == []
    finally:
        embedded.stop()
    _assert_model_learned_each_once(checkpoints, messages)


# -- 4. No bootstrap servers: the embedded broker --------------------------------------------


def test_serve_without_bootstrap_servers_runs_and_stops_its_embedded_broker(tmp_path):
    topics = _topics("embedded")
    checkpoints = tmp_path / "checkpoints"
    config = _write_config(tmp_path / "serve.toml", None, topics, checkpoints)
    with Serve(config, tmp_path / "serve.log") as serve:
        said = serve.wait_log(
            r"WARNING connectors\.daemon: no kafka\.bootstrap_servers configured: started the "
            r"embedded broker at (127\.0\.0\.1:\d+) \(memory only", timeout=30)[0]
        servers = said.group(1)
        # The broker is the daemon's child, recorded now so that teardown can kill it too.
        serve.children = _children(serve.process.pid)
        brokers = {
            pid: started for pid, started in serve.children.items()
            if "tansu" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            and servers.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
        }
        assert len(brokers) == 1, serve.children
        serve.wait_log(rf"connected to {re.escape(servers)}:", timeout=30)

        messages = _stream(20, seed=3)
        produce(servers, topics["input"], messages)
        answered = read_all(servers, topics["output"], expected=len(messages), timeout=30)
        assert sorted(o["source"]["offset"] for o in answered) == list(range(len(messages)))

        assert serve.signal(signal.SIGTERM, timeout=20) == 0, serve.tail()
    assert "stopped the embedded broker on " + servers in serve.text()
    for pid, started in brokers.items():
        assert not _same_process_alive(pid, started), f"orphan broker process {pid}"
    assert _next_offset(checkpoints, topics["input"]) == len(messages)

    # Started again, it brings a new broker, its topics empty: the model restored learns on,
    # the new topic read from its start. (It refused to start: "no longer holds the offsets".)
    more = [{**m, "id": 100 + m["id"]} for m in _stream(10, seed=4)]
    with Serve(config, tmp_path / "again.log") as serve:
        servers = serve.wait_log(r"started the embedded broker at (127\.0\.0\.1:\d+) .*a "
                                 r"restart keeps the model", timeout=30)[0].group(1)
        serve.children = _children(serve.process.pid)
        serve.wait_log(rf"connected to {re.escape(servers)}:", timeout=30)
        produce(servers, topics["input"], more)
        answered = read_all(servers, topics["output"], expected=len(more), timeout=30)
        assert sorted(o["source"]["offset"] for o in answered) == list(range(len(more)))
        assert serve.signal(signal.SIGTERM, timeout=20) == 0, serve.tail()
    assert "kafka.on_partition_reset = 'earliest': the model is kept" in serve.text()
    _assert_model_learned_each_once(checkpoints, messages + more)
