"""Fixtures and helpers of the connector tests: the embedded broker (one per test session,
always stopped at the end), topic names, producing and reading back whole topics."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from connectors.broker import EmbeddedBroker

_counter = itertools.count()


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    """The embedded broker, stopped (killed if need be) when the session ends."""
    embedded = EmbeddedBroker(start_timeout=20)
    embedded.start()
    try:
        yield embedded
    finally:
        embedded.stop()


def unique(prefix: str) -> str:
    """A topic or group name no other test uses (the broker is shared by the session)."""
    return f"{prefix}-{int(time.time() * 1000) % 10**8}-{next(_counter)}"


def produce(servers: str, topic: str, messages: list[Any], key_of=None) -> None:
    """Send messages (dicts become JSON, bytes are sent as they are) and wait for them."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=servers, acks="all", linger_ms=1)
    try:
        for message in messages:
            value = message if isinstance(message, bytes) else json.dumps(message).encode()
            key = key_of(message) if key_of else None
            producer.send(topic, key=key, value=value)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=10)


def read_all(servers: str, topic: str, expected: int | None = None, timeout: float = 30.0,
             idle: float = 1.0) -> list[Any]:
    """Every message of ``topic`` (decoded JSON), in offset order per partition; waits until
    ``expected`` messages are there (or ``timeout``), else until ``idle`` s without news."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False,
                             auto_offset_reset="earliest", consumer_timeout_ms=500)
    try:
        deadline = time.monotonic() + timeout
        # A daemon creates its output topics once it runs: under load, after the reader
        # started. Until then there is nothing to read.
        partitions = consumer.partitions_for_topic(topic)
        while not partitions and expected and time.monotonic() < deadline:
            time.sleep(0.2)
            partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            return []
        consumer.assign([TopicPartition(topic, p) for p in sorted(partitions)])
        consumer.seek_to_beginning()
        found: list[Any] = []
        last_news = time.monotonic()
        while time.monotonic() < deadline:
            polled = consumer.poll(timeout_ms=200)
            batch = [r for records in polled.values() for r in records]
            if batch:
                last_news = time.monotonic()
                found += [json.loads(r.value) for r in batch]
            if expected is not None and len(found) >= expected:
                break
            if expected is None and time.monotonic() - last_news > idle:
                break
        return found
    finally:
        consumer.close()


def wait_for(condition, timeout: float, interval: float = 0.05) -> bool:
    """Poll ``condition()`` until true or ``timeout`` seconds (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return bool(condition())


def committed(servers: str, group: str, topic: str, partition: int = 0) -> int | None:
    """The offset ``group`` committed for ``topic[partition]`` (None: never committed)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=servers, group_id=group, enable_auto_commit=False)
    try:
        return consumer.committed(TopicPartition(topic, partition))
    finally:
        consumer.close()
