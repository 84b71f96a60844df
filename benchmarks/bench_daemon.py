"""Throughput and latency of the daemon on the embedded broker, against the bare kafka-python
consume-parse-produce loop measured in the same run (the transport's ceiling).

    python benchmarks/bench_daemon.py [--messages 5000] [--rate 300] [--seconds 5]
        [--fetch-max-wait-ms 50]

Throughput: N labelled Bananas messages are in the input topic before the consumer starts;
messages per second from the first poll to the last flush. Each model runs in both prediction
modes: progressive (each message predicted by the model that learned every earlier one, the
default) and per poll (``kafka.predict_per_poll``: one prediction per poll, runs learned in one
multiple update). Latency: messages produced at a fixed
rate while the consumer runs; from each input's Kafka timestamp to the flush of its output.
The bare loop and the daemon hold their fetches equally long (``kafka.fetch_max_wait_ms``, the
daemon's default unless given): the embedded broker answers a fetch that found nothing only at the
end of that wait, which bounds both loops' latency.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from typing import Any

import numpy as np
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from connectors.broker import EmbeddedBroker
from connectors.config import FETCH_MAX_WAIT_MS, load_config
from connectors.daemon import Daemon, ensure_topics
from connectors.messages import encode
from connectors.sources import iter_source

_names = iter(range(10**6))


def _topics(servers: str, prefix: str) -> tuple[str, str]:
    number = next(_names)
    topics = (f"{prefix}-in-{number}", f"{prefix}-out-{number}")
    ensure_topics({"bootstrap_servers": [servers]}, [*topics, f"{prefix}-dead-{number}"])
    return topics


def _messages(n: int) -> list[bytes]:
    points = list(iter_source("bananas"))
    return [
        encode({"id": i, "x": points[i % len(points)][0], "y": points[i % len(points)][1]})
        for i in range(n)
    ]


def _produce(servers: str, topic: str, messages: list[bytes], rate: float | None) -> None:
    producer = KafkaProducer(bootstrap_servers=servers, acks="all", linger_ms=0 if rate else 5)
    started = time.perf_counter()
    for i, value in enumerate(messages):
        if rate:
            delay = started + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        producer.send(topic, key=str(i).encode(), value=value)
        if rate:
            producer.flush()
    producer.flush()
    producer.close()


def bare_loop(servers: str, source: str, target: str, n: int, max_batch: int,
              fetch_max_wait_ms: int, batch_size: int = 16384,
              name_partition: bool = False) -> dict[str, Any]:
    """Consume, parse JSON, produce a small JSON answer, flush per batch: no model.
    ``batch_size``: the producer's (16384, kafka-python's default; the daemon's is 512 KB).
    ``name_partition``: send to partition 0 by name, as the daemon does for a topic of one
    partition (kafka-python's partitioner otherwise hashes every key)."""
    consumer = KafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_wait_ms=fetch_max_wait_ms)
    consumer.assign([TopicPartition(source, 0)])
    producer = KafkaProducer(bootstrap_servers=servers, acks="all", linger_ms=2,
                             batch_size=batch_size)
    done, latencies, first = 0, [], None
    deadline = time.monotonic() + 300
    while done < n and time.monotonic() < deadline:
        polled = consumer.poll(timeout_ms=100, max_records=max_batch)
        records = [r for batch in polled.values() for r in batch]
        if not records:
            continue
        first = first or time.perf_counter()
        for record in records:
            message = json.loads(record.value)
            answer = {"id": message["id"], "prediction": False, "score": 0.0,
                      "source": {"topic": record.topic, "offset": record.offset}}
            # (_topics creates every topic with one partition: 0 is the partitioner's choice)
            producer.send(target, key=str(message["id"]).encode(), value=encode(answer),
                          partition=0 if name_partition else None)
        producer.flush()
        now = time.time() * 1000
        latencies += [(now - r.timestamp) / 1000 for r in records]
        done += len(records)
    seconds = time.perf_counter() - (first or time.perf_counter())
    consumer.close()
    producer.close()
    return {"messages": done, "seconds": seconds, "latencies": latencies}


def daemon_run(servers: str, source: str, target: str, n: int, model: dict[str, Any],
               max_batch: int, per_poll: bool, fetch_max_wait_ms: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as directory:
        config = load_config(None, {
            "kafka.bootstrap_servers": servers,
            "kafka.input_topic": source,
            "kafka.output_topic": target,
            "kafka.dead_letter_topic": source.replace("-in-", "-dead-"),
            "kafka.max_batch": max_batch,
            "kafka.predict_per_poll": per_poll,
            "kafka.fetch_max_wait_ms": fetch_max_wait_ms,
            "checkpoint.dir": directory,
            "checkpoint.every_messages": 100_000,
            "checkpoint.every_seconds": 3600,
            "metrics.enabled": False,
            **{f"model.{k}": v for k, v in model.items()},
        }, environ={})
        daemon = Daemon(config)
        first: list[float] = []
        daemon.on_batch = lambda d: first or first.append(time.perf_counter())
        thread = threading.Thread(target=daemon.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 300
        while daemon.summary.messages < n and time.monotonic() < deadline and thread.is_alive():
            time.sleep(0.01)
        end = time.perf_counter()
        daemon.stop()
        thread.join(timeout=60)
    # The first batch's own processing time is not counted by on_batch: add it back roughly
    # by counting from its end, and the messages of that batch are left out accordingly.
    return {"messages": daemon.summary.messages, "seconds": end - first[0] if first else 0.0,
            "latencies": daemon.latencies}


def _row(name: str, throughput: dict[str, Any], latency: dict[str, Any]) -> dict[str, Any]:
    lat = np.asarray(latency["latencies"]) * 1000
    return {
        "setup": name,
        "msg_per_s": throughput["messages"] / max(throughput["seconds"], 1e-9),
        "p50_ms": float(np.percentile(lat, 50)) if lat.size else float("nan"),
        "p99_ms": float(np.percentile(lat, 99)) if lat.size else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=300.0, help="messages/s for latency")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of latency runs")
    parser.add_argument("--max-batch", type=int, default=500)
    parser.add_argument("--fetch-max-wait-ms", type=int,
                        default=FETCH_MAX_WAIT_MS,
                        help="how long the broker holds an empty fetch, for both loops")
    args = parser.parse_args()
    setups = {
        "IncrementalSVC (RBF, C=1, gamma=1)": {"type": "IncrementalSVC", "gamma": 1.0},
        "SlidingWindowSVC (window 1000, RBF, gamma=1)": {
            "type": "SlidingWindowSVC", "window_size": 1000, "step": 1, "gamma": 1.0},
    }
    bulk = _messages(args.messages)
    paced = _messages(int(args.rate * args.seconds))
    rows = []
    with EmbeddedBroker() as broker:
        servers = broker.bootstrap_servers

        def measure(run) -> tuple[dict[str, Any], dict[str, Any]]:
            source, target = _topics(servers, "bench")
            _produce(servers, source, bulk, None)
            throughput = run(source, target, len(bulk))
            source, target = _topics(servers, "bench")
            producer = threading.Thread(target=_produce, args=(servers, source, paced, args.rate))
            result: dict[str, Any] = {}
            consumer = threading.Thread(
                target=lambda: result.update(run(source, target, len(paced))))
            consumer.start()
            time.sleep(1.0)  # let the consumer connect first: latency, not backlog
            producer.start()
            producer.join()
            consumer.join()
            return throughput, result

        wait = args.fetch_max_wait_ms
        bare = measure(lambda s, t, n: bare_loop(servers, s, t, n, args.max_batch, wait))
        rows.append(_row("bare kafka-python loop (consume, parse, produce)", *bare))
        bare = measure(lambda s, t, n: bare_loop(servers, s, t, n, args.max_batch, wait,
                                                 512 << 10, name_partition=True))
        rows.append(_row("bare loop sending as the daemon does (512 KB batches, partition "
                         "named)", *bare))
        for name, model in setups.items():
            for per_poll in (False, True):
                result = measure(lambda s, t, n, m=model, pp=per_poll: daemon_run(
                    servers, s, t, n, m, args.max_batch, pp, wait))
                mode = "per poll" if per_poll else "progressive"
                rows.append(_row(f"daemon, {name}, {mode}", *result))
    ceiling, batched = rows[0]["msg_per_s"], rows[1]["msg_per_s"]
    print(f"{args.messages} messages for throughput; {args.rate:g} msg/s for "
          f"{args.seconds:g} s for latency; max_batch {args.max_batch}; "
          f"fetch_max_wait_ms {args.fetch_max_wait_ms}\n")
    print("| setup | msg/s | of bare loop | of bare loop sending as the daemon | "
          "p50 latency (ms) | "
          "p99 latency (ms) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(f"| {row['setup']} | {row['msg_per_s']:,.0f} | {row['msg_per_s'] / ceiling:.0%} "
              f"| {row['msg_per_s'] / batched:.0%} | {row['p50_ms']:.1f} "
              f"| {row['p99_ms']:.1f} |")


if __name__ == "__main__":
    main()
