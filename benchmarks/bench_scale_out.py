"""Scale-out of the Kafka daemon (``model.scope = "key"``) on the embedded broker: throughput
with 1 and 2 daemon processes, the output pause of a rebalance, and the state-restore time as a
function of model size.

    .venv/bin/python benchmarks/bench_scale_out.py [--per-key 2500] [--repeats 3]
        [--rate 300] [--sizes 100,1000,5000,20000]

Writes the report to ``benchmarks/BENCHMARKS_scale_out.md`` (and prints it); daemon logs are
kept in a temporary directory named in the report.

1. Throughput: IncrementalSVC (RBF, C=1, gamma=0.5), one model per key, 8 keys on a
   4-partition input topic (key k on partition k % 4), River's Bananas split among the keys
   (cycled with a 1e-6 jitter past its 5300 points), every message labelled. All messages are
   in the topic before the daemons (``python -m connectors.cli serve``, one consumer group)
   start; msg/s from the first output record's Kafka timestamp to the last one's. Per process:
   the ``messages`` of its final ``stopped: {...}`` log line (after SIGTERM) over that window.
2. Rebalance pause: 2 daemons on a stream produced at a fixed rate; then a third daemon starts
   ("a member joins") or one of the two is SIGKILLed ("a member is killed", session timeout
   3 s). Per input partition, the longest gap between output records (Kafka timestamps) from
   2 s before to 15 s after the event, and the time from the event until every partition has
   outputs again (the end of the last gap > 0.5 s that ends after the event).
3. State restore: :class:`connectors.state_store.StateStore` alone, one IncrementalSVC with n
   stored points published on a fresh state topic; median of 5 of ``restore()`` (whole topic,
   decoded), ``restore(decode=False)`` + ``fetch(model_id)`` (each with a new store: its
   clients' connection included), and ``IncrementalSVC.from_checkpoint``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import ROOT, machine_info, markdown_table

from connectors.broker import EmbeddedBroker
from connectors.daemon import ensure_topics
from connectors.sources import iter_source
from connectors.state_store import StateStore, _encode_payload
from stream_svm import IncrementalSVC

REPORT = ROOT / "benchmarks" / "BENCHMARKS_scale_out.md"
MODEL = {"C": 1.0, "gamma": 0.5}
PARTITIONS, KEYS = 4, 8
Row = tuple[int, str, bytes]  # (partition, key, value)
_names = itertools.count()


# -- data and topics ---------------------------------------------------------------------------


def _points(n: int) -> list[tuple[dict[str, float], bool]]:
    """n labelled Bananas points; past its end, again with a jitter of 1e-6 (no duplicates)."""
    bananas = list(iter_source("bananas"))
    rng = np.random.default_rng(0)
    points = []
    for i in range(n):
        x, y = bananas[i % len(bananas)]
        if i >= len(bananas):
            x = {name: value + float(rng.normal(0, 1e-6)) for name, value in x.items()}
        points.append((x, y))
    return points


def _keyed_rows(points: Sequence[tuple[dict[str, float], bool]], start: int = 0) -> list[Row]:
    """Point i goes to key k = i % KEYS, on partition k % PARTITIONS (as the tests'
    ``_keyed_stream``), labelled."""
    rows = []
    for i, (x, y) in enumerate(points, start):
        k = i % KEYS
        rows.append((k % PARTITIONS, f"k{k}", json.dumps({"id": f"{k}-{i}", "x": x, "y": y})
                     .encode()))
    return rows


def _topics(servers: str, prefix: str) -> dict[str, str]:
    number = next(_names)
    topics = {k: f"{prefix}-{k}-{number}-{os.getpid()}" for k in ("input", "output", "dead")}
    ensure_topics({"bootstrap_servers": servers}, [topics["input"]], partitions=PARTITIONS)
    ensure_topics({"bootstrap_servers": servers}, [topics["output"], topics["dead"]])
    return topics


def _produce(servers: str, topic: str, rows: Sequence[Row], rate: float | None = None,
             stop: threading.Event | None = None) -> int:
    """Send rows (at ``rate`` msg/s, flushing each, when given); returns how many were sent."""
    producer = KafkaProducer(bootstrap_servers=servers, acks="all",
                             linger_ms=0 if rate else 5)
    sent = 0
    try:
        started = time.perf_counter()
        for i, (partition, key, value) in enumerate(rows):
            if stop is not None and stop.is_set():
                break
            if rate:
                delay = started + i / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            producer.send(topic, key=key.encode(), value=value, partition=partition)
            sent += 1
            if rate and i % 10 == 9:
                producer.flush(timeout=30)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=10)
    return sent


class Follower:
    """Reads the output topic in a thread: (source partition, Kafka timestamp in s) of every
    answer to a feature message."""

    def __init__(self, servers: str, topic: str) -> None:
        self.consumer = KafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False)
        self.consumer.assign([TopicPartition(topic, 0)])
        self.consumer.seek_to_beginning()
        self.outputs: list[tuple[int, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for records in self.consumer.poll(timeout_ms=100).values():
                for record in records:
                    output = json.loads(record.value)
                    if "op" not in output and "source" in output:
                        self.outputs.append((output["source"]["partition"],
                                             record.timestamp / 1000))

    def count(self) -> int:
        return len(self.outputs)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.consumer.close()


# -- daemons -----------------------------------------------------------------------------------


def _config_file(path: Path, servers: str, topics: dict[str, str], group: str) -> Path:
    settings: dict[str, dict[str, Any]] = {
        "kafka": {"bootstrap_servers": servers, "input_topic": topics["input"],
                  "output_topic": topics["output"], "dead_letter_topic": topics["dead"],
                  "group_id": group, "max_batch": 100, "request_timeout_ms": 10000,
                  "session_timeout_ms": 3000, "heartbeat_interval_ms": 300,
                  "poll_timeout_ms": 50},
        "model": {"type": "IncrementalSVC", "scope": "key", "max_models": 100, **MODEL},
        "checkpoint": {"every_messages": 500},
        "metrics": {"enabled": False},
    }
    lines = []
    for section, values in settings.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


class Daemons:
    """Daemon processes of one consumer group, their logs in ``directory``; every one is
    stopped (SIGTERM, then SIGKILL after 60 s) on exit."""

    def __init__(self, config: Path, directory: Path, name: str) -> None:
        self.config, self.directory, self.name = config, directory, name
        self.processes: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    def start(self) -> subprocess.Popen:
        log_path = self.directory / f"{self.name}-daemon{len(self.logs)}.log"
        command = [sys.executable, "-m", "connectors.cli", "--log-level", "INFO", "serve",
                   "--config", str(self.config)]
        with open(log_path, "ab") as log:
            process = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                       stdout=log, stderr=log, cwd=ROOT)
        self.processes.append(process)
        self.logs.append(log_path)
        return process

    def text(self, index: int) -> str:
        return self.logs[index].read_text(errors="replace")

    def check_alive(self) -> None:
        for index, process in enumerate(self.processes):
            code = process.poll()
            if code is not None and code != -signal.SIGKILL:
                raise RuntimeError(f"daemon {index} exited with {code}:\n"
                                   f"{self.text(index)[-2000:]}")

    def stop(self) -> list[int | None]:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        return [p.returncode for p in self.processes]

    def stopped_messages(self, index: int) -> int | None:
        """``messages`` of the final ``stopped: {...}`` line of a daemon's log."""
        found = None
        for line in self.text(index).splitlines():
            if "stopped: {" in line:
                found = json.loads(line[line.index("stopped: {") + len("stopped: "):])
        return None if found is None else int(found["messages"])

    def problems(self) -> list[str]:
        """WARNING, ERROR and Traceback lines of every log."""
        found = []
        for index in range(len(self.logs)):
            found += [f"{self.logs[index].name}: {line.strip()}"
                      for line in self.text(index).splitlines()
                      if "WARNING" in line or "ERROR" in line or "Traceback" in line]
        return found

    def count(self, needle: str) -> int:
        return sum(self.text(i).count(needle) for i in range(len(self.logs)))


@contextmanager
def _daemons(config: Path, directory: Path, name: str) -> Iterator[Daemons]:
    group = Daemons(config, directory, name)
    try:
        yield group
    finally:
        group.stop()


def _wait(condition: Callable[[], bool], seconds: float, check: Callable[[], None]) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        check()
        time.sleep(0.05)
    return condition()


# -- 1. throughput -----------------------------------------------------------------------------


def throughput_run(servers: str, directory: Path, rows: list[Row], processes: int,
                   label: str, problems: list[str]) -> dict[str, Any]:
    topics = _topics(servers, "tput")
    _produce(servers, topics["input"], rows)
    config = _config_file(directory / f"{label}.toml", servers, topics,
                          f"tput-group-{label}-{os.getpid()}")
    follower = Follower(servers, topics["output"])
    try:
        with _daemons(config, directory, label) as group:
            for _ in range(processes):
                group.start()
            done = _wait(lambda: follower.count() >= len(rows), 300, group.check_alive)
            exits = group.stop()
            answered = [group.stopped_messages(i) for i in range(processes)]
            rebalances = group.count("revoked")
            problems += group.problems()
    finally:
        time.sleep(0.3)
        follower.close()
    if not done:
        raise RuntimeError(f"{label}: {follower.count()} of {len(rows)} answered")
    stamps = sorted(t for _, t in follower.outputs)
    window = stamps[-1] - stamps[0]
    return {"window": window, "total": len(rows) / window,
            "outputs": len(follower.outputs), "answered": answered, "exits": exits,
            "per_process": [None if a is None else a / window for a in answered],
            "rebalances": rebalances}


# -- 2. rebalance pause ------------------------------------------------------------------------


def _gaps(outputs: list[tuple[int, float]], event: float, before: float = 2.0,
          after: float = 15.0, stall: float = 0.5) -> tuple[dict[int, float], float]:
    """Per partition, the longest gap between outputs within [event - before, event + after];
    and the time from the event until every partition has outputs again."""
    longest, recovered = {}, 0.0
    for partition in range(PARTITIONS):
        times = sorted(t for p, t in outputs if p == partition
                       and event - before <= t <= event + after)
        if len(times) < 2:
            longest[partition] = float("nan")
            recovered = float("nan")
            continue
        steps = np.diff(times)
        longest[partition] = float(steps.max())
        for end, step in zip(times[1:], steps, strict=True):
            if step > stall and end > event:
                recovered = max(recovered, end - event)
    return longest, recovered


def rebalance_run(servers: str, directory: Path, rate: float, event: str, label: str,
                  problems: list[str]) -> dict[str, Any]:
    topics = _topics(servers, f"rebal-{event}")
    config = _config_file(directory / f"{label}.toml", servers, topics,
                          f"rebal-group-{label}-{os.getpid()}")
    rows = _keyed_rows(_points(int(rate * 120)))
    stop = threading.Event()
    sent: list[int] = []
    producer = threading.Thread(
        target=lambda: sent.append(_produce(servers, topics["input"], rows, rate, stop)),
        daemon=True)
    follower = Follower(servers, topics["output"])
    try:
        with _daemons(config, directory, label) as group:
            group.start()
            group.start()
            producer.start()
            # Steady: both daemons own partitions, every partition answered for 4 s.
            ok = _wait(lambda: all("ready" in group.text(i) for i in range(2)), 60,
                       group.check_alive)
            time.sleep(4.0)
            recent = {p for p, t in follower.outputs if t > time.time() - 1.0}
            if not ok or recent != set(range(PARTITIONS)):
                raise RuntimeError(f"{label}: not steady ({recent}):\n"
                                   f"{group.text(0)[-1500:]}\n{group.text(1)[-1500:]}")
            moment = time.time()
            if event == "join":
                group.start()
            else:
                group.processes[1].send_signal(signal.SIGKILL)
                group.processes[1].wait(timeout=10)
            time.sleep(15.0)
            stop.set()
            producer.join(timeout=30)
            # Let the backlog be answered before stopping.
            _wait(lambda: len({(p, t) for p, t in follower.outputs}) >= (sent or [0])[0],
                  30, group.check_alive)
            exits = group.stop()
            problems += group.problems()
    finally:
        stop.set()
        time.sleep(0.3)
        follower.close()
    longest, recovered = _gaps(follower.outputs, moment)
    return {"longest": longest, "recovered": recovered, "exits": exits,
            "sent": sent[0] if sent else None, "outputs": len(follower.outputs)}


# -- 3. state restore --------------------------------------------------------------------------


def _models(sizes: Sequence[int]) -> dict[int, tuple[dict[str, np.ndarray], dict[str, Any],
                                                     float]]:
    """IncrementalSVC checkpoints with n stored points (2-D points, a noise-free RBF boundary
    with a margin of 0.3: mostly reserve points, so even 20000 builds in seconds), and the
    seconds the model took to learn them."""
    rng = np.random.default_rng(1)
    wanted = max(sizes)
    X = rng.uniform(-3, 3, size=(3 * wanted, 2))
    boundary = X[:, 0] + 0.5 * np.sin(2 * X[:, 1])
    X, y = X[np.abs(boundary) > 0.3][:wanted], (boundary > 0)[np.abs(boundary) > 0.3][:wanted]
    model = IncrementalSVC(**MODEL)
    found = {}
    started = time.perf_counter()
    for i in range(wanted):
        model.learn_one({"1": float(X[i, 0]), "2": float(X[i, 1])}, bool(y[i]), key=i)
        if i + 1 in sizes:
            arrays, meta = model.to_checkpoint()
            found[i + 1] = ({k: np.asarray(v) for k, v in arrays.items()}, meta,
                            time.perf_counter() - started)
    return found


def restore_sizes(servers: str, sizes: Sequence[int], repeats: int) -> list[list[Any]]:
    rows = []
    for n, (arrays, meta, learn_seconds) in _models(sizes).items():
        topic = f"restore-{n}-{next(_names)}-{os.getpid()}"
        model_id = (0, "k0")
        metadata = {"format": 1, "scope": "key", "model_meta": meta}
        payload = len(_encode_payload(arrays, metadata))
        with StateStore(servers, topic, timeout=60) as store:
            store.ensure_topic(partitions=1)
            store.publish(model_id, arrays, metadata, next_offset=n, epoch=0, sequence=1)
        whole, lazy, chunks = [], [], None
        for _ in range(repeats):
            with StateStore(servers, topic, timeout=60) as store:
                started = time.perf_counter()
                states = store.restore()
                whole.append(time.perf_counter() - started)
                assert states[model_id].arrays["X"].shape == (n, 2)
            with StateStore(servers, topic, timeout=60) as store:
                started = time.perf_counter()
                located = store.restore(decode=False)
                state = store.fetch(model_id)
                lazy.append(time.perf_counter() - started)
                assert state.arrays["X"].shape == (n, 2)
                _, first, last = located[model_id].location  # type: ignore[misc]
                chunks = last - first + 1
        rebuild = []
        for _ in range(repeats):
            started = time.perf_counter()
            IncrementalSVC.from_checkpoint(arrays, meta)
            rebuild.append(time.perf_counter() - started)
        rows.append([n, len(arrays["margin"]), payload, chunks,
                     1000 * statistics.median(whole), 1000 * statistics.median(lazy),
                     1000 * statistics.median(rebuild), learn_seconds])
    return rows


# -- report ------------------------------------------------------------------------------------


def _spread(values: Sequence[float], digits: int = 0) -> str:
    values = [v for v in values if v is not None and not np.isnan(v)]
    if not values:
        return "n/a"
    fmt = f"{{:,.{digits}f}}"
    return (f"{fmt.format(statistics.median(values))} "
            f"({fmt.format(min(values))}-{fmt.format(max(values))})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-key", type=int, default=2500,
                        help="labelled messages per key for throughput (8 keys)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rate", type=float, default=300.0,
                        help="msg/s of the stream during rebalances")
    parser.add_argument("--sizes", default="100,1000,5000,20000",
                        help="stored points of the restored models")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: 1,2,3")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    sizes = [int(s) for s in args.sizes.split(",")]
    logs = Path(tempfile.mkdtemp(prefix="bench-scale-out-"))
    started_at = datetime.now(UTC)
    started = time.monotonic()
    problems: list[str] = []
    sections = []
    with EmbeddedBroker(start_timeout=20) as broker:
        servers = broker.bootstrap_servers
        if "1" not in skip:
            rows = _keyed_rows(_points(KEYS * args.per_key))
            table = []
            for processes in (1, 2):
                runs = []
                for repeat in range(args.repeats):
                    run = throughput_run(servers, logs, rows, processes,
                                         f"tput-{processes}p-{repeat}", problems)
                    print(f"throughput {processes} process(es), run {repeat}: {run}",
                          flush=True)
                    runs.append(run)
                per_process = [v for r in runs for v in r["per_process"]]
                table.append([
                    processes, _spread([r["total"] for r in runs]),
                    _spread(per_process),
                    "; ".join("/".join(str(a) for a in r["answered"]) for r in runs),
                    _spread([r["window"] for r in runs], 1),
                    "; ".join(str(r["rebalances"]) for r in runs),
                    "; ".join(",".join(str(e) for e in r["exits"]) for r in runs),
                ])
            sections.append(
                f"### 1. Throughput ({len(rows)} labelled messages, {KEYS} keys, "
                f"{PARTITIONS} partitions, median (range) of {args.repeats} runs)\n\n"
                + markdown_table(["daemons", "total msg/s", "msg/s per process",
                                  "messages per process (each run)",
                                  "first to last output (s)", "'revoked' log lines (each run)",
                                  "exit codes"], table))
        if "2" not in skip:
            table = []
            for event in ("join", "kill"):
                runs = []
                for repeat in range(args.repeats):
                    run = rebalance_run(servers, logs, args.rate, event,
                                        f"rebal-{event}-{repeat}", problems)
                    print(f"rebalance {event}, run {repeat}: {run}", flush=True)
                    runs.append(run)
                table.append([
                    "a member joins (2 -> 3)" if event == "join" else
                    "a member is killed (2 -> 1, SIGKILL)",
                    _spread([max(r["longest"].values()) for r in runs], 2),
                    "; ".join(" ".join(f"{r['longest'][p]:.2f}" for p in range(PARTITIONS))
                              for r in runs),
                    _spread([r["recovered"] for r in runs], 2),
                    "; ".join(f"{r['outputs']}/{r['sent']}" for r in runs),
                ])
            sections.append(
                f"### 2. Rebalance pause ({args.rate:g} msg/s, median (range) of "
                f"{args.repeats} runs)\n\n"
                + markdown_table(["event", "longest output gap, any partition (s)",
                                  "longest gap per partition 0-3 (s, each run)",
                                  "event to every partition answering again (s)",
                                  "outputs/produced (each run)"], table))
        if "3" not in skip:
            table = restore_sizes(servers, sizes, 5)
            sections.append(
                "### 3. State restore (one IncrementalSVC on a fresh state topic, median of 5)"
                "\n\n" + markdown_table(
                    ["stored points", "margin set", "payload bytes", "chunks",
                     "restore() (ms)", "restore(decode=False) + fetch (ms)",
                     "from_checkpoint (ms)", "learning them (s, once)"], table))
    seconds = time.monotonic() - started
    header = (
        "## Scale-out on Kafka (`benchmarks/bench_scale_out.py`)\n\n"
        f"Run: `.venv/bin/python benchmarks/bench_scale_out.py --per-key {args.per_key} "
        f"--repeats {args.repeats} --rate {args.rate:g} --sizes {args.sizes}` "
        f"({started_at:%Y-%m-%d %H:%M} UTC, {seconds / 60:.1f} min). Embedded broker on "
        "127.0.0.1; daemons `python -m connectors.cli serve` with `model.scope = \"key\"`, "
        "IncrementalSVC (RBF, C=1, gamma=0.5), `kafka.max_batch` 100, "
        "`checkpoint.every_messages` 500, session timeout 3000 ms, heartbeat 300 ms, "
        f"metrics off. Daemon logs: `{logs}`.\n\n"
        f"The machine has {os.cpu_count()} cores, shared by the broker, the producer, the "
        "follower and every daemon: with 2 daemons each process gets about one core at best, "
        "so the per-process figures matter more than the totals.\n\n"
        + machine_info())
    notes = ("\n\nLog lines with WARNING/ERROR/Traceback: "
             + (str(len(problems)) + "; first ones:\n\n```\n" + "\n".join(problems[:20])
                + "\n```" if problems else "none."))
    text = header + "\n\n" + "\n\n".join(sections) + notes
    REPORT.write_text(text + "\n", encoding="utf-8")
    print(text, flush=True)
    print(f"\n[written to {REPORT.relative_to(ROOT)}; logs in {logs}]", flush=True)


if __name__ == "__main__":
    main()
