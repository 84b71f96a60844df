"""The Kafka consumer daemon: input (and label) topics in, predictions, acknowledgements and
dead letters out, the model checkpointed with the offsets it has learned.

Guarantees
    - The model never learns a message twice: a checkpoint holds the model together with the
      next offset of every partition, the daemon resumes reading at those offsets, and skips
      anything below them.
    - No output is lost: a checkpoint is written, and offsets are committed, only after the
      outputs up to them are flushed to the broker. After a crash some outputs may repeat.
    - One daemon owns a model and reads every partition of its topics (partitions are assigned,
      not balanced in a consumer group: several daemons on one group would split the stream
      between several models). The checkpoint directory is locked against a second daemon.

>>> from connectors.config import load_config
>>> config = load_config("configs/default.toml")        # doctest: +SKIP
>>> Daemon(config).run()                                 # doctest: +SKIP
0
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from connectors.broker import EmbeddedBroker
from connectors.checkpoint import Checkpoint, CheckpointError, CheckpointStore
from connectors.config import Config, kafka_client_settings
from connectors.messages import encode
from connectors.metrics import Metrics
from connectors.models import build_model, model_settings, restore_model
from connectors.processor import Processor

__all__ = ["Daemon", "DaemonError", "RunSummary", "ensure_topics"]

log = logging.getLogger(__name__)


class DaemonError(RuntimeError):
    """The daemon cannot start (e.g. the checkpoint directory is used by another daemon)."""


@dataclass
class RunSummary:
    """Counts of one run of the daemon."""

    messages: int = 0
    outputs: int = 0
    dead_letters: int = 0
    skipped: int = 0
    batches: int = 0
    checkpoints: int = 0
    seconds: float = 0.0
    accuracy: float = float("nan")
    breakpoints: int = 0
    exit_code: int = 0


class _Backoff:
    def __init__(self, initial: float, maximum: float, attempts: int) -> None:
        self.initial, self.maximum, self.attempts = initial, maximum, attempts
        self.failures = 0

    def wait(self, stop: threading.Event, what: str, error: BaseException) -> None:
        self.failures += 1
        if self.attempts and self.failures >= self.attempts:
            raise DaemonError(f"{what}: giving up after {self.failures} attempts: {error}")
        delay = min(self.maximum, self.initial * 2 ** (self.failures - 1))
        log.warning(
            "%s (attempt %d): %s; retrying in %.1f s", what, self.failures, error, delay
        )
        stop.wait(delay)

    def reset(self) -> None:
        self.failures = 0


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DaemonError(
                f"checkpoint directory {directory} is in use by another daemon"
            ) from None
        handle.write(str(os.getpid()))
        handle.flush()
        yield


def ensure_topics(client: dict[str, Any], topics: list[str], partitions: int = 1) -> list[str]:
    """Create the missing ones of ``topics`` (replication factor 1); returns those created.
    ``client`` holds kafka-python client settings (at least ``bootstrap_servers``)."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(**client)
    try:
        existing = set(admin.list_topics())
        missing = [t for t in dict.fromkeys(topics) if t not in existing]
        if missing:
            try:
                admin.create_topics([NewTopic(t, partitions, 1) for t in missing])
                log.info("created topics %s", ", ".join(missing))
            except TopicAlreadyExistsError:
                pass
        return missing
    finally:
        admin.close()


class Daemon:
    """Runs the consume-predict-learn-produce loop until stopped.

    ``stop()`` (or SIGTERM/SIGINT when ``install_signal_handlers``) finishes the current batch,
    flushes, checkpoints, commits and returns. While the broker is unreachable, flushing waits
    for it; a second ``stop()`` gives the undelivered outputs up instead: then nothing more is
    checkpointed or committed, the exit code is 1 and the restart repeats the stream from the
    last checkpoint. ``until_drained`` stops once every partition has been read up to its high
    watermark and a poll came back empty (demo, tests, batch jobs).
    """

    def __init__(
        self,
        config: Config,
        *,
        metrics: Metrics | None = None,
        until_drained: bool = False,
        install_signal_handlers: bool = False,
        on_batch: Callable[[Daemon], None] | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or Metrics()
        self.until_drained = until_drained
        self.install_signal_handlers = install_signal_handlers
        self.on_batch = on_batch
        self.stop_event = threading.Event()
        self.summary = RunSummary()
        self.latencies: list[float] = []  # seconds from input timestamp to flushed output
        self.metrics_port: int | None = None
        self.broker: EmbeddedBroker | None = None
        self.processor: Processor | None = None
        self._consumer: Any = None
        self._producer: Any = None
        self._store: CheckpointStore | None = None
        self._since_checkpoint = 0
        self._last_checkpoint = time.monotonic()
        self._last_commit = 0.0
        self._committed: dict[str, int] = {}
        self._started = time.monotonic()
        self._stop_requests = 0
        # Set when a second stop gave undelivered outputs up: the processor's state then runs
        # ahead of the outputs, so it must be neither checkpointed nor committed.
        self._undelivered = False

    # -- lifecycle -------------------------------------------------------------------------

    def stop(self, *_: object) -> None:
        self._stop_requests += 1
        if self._stop_requests == 1:
            log.info("stopping: finishing the batch, flushing, checkpointing, committing")
        elif self._stop_requests == 2:
            log.warning(
                "stop requested again: outputs that cannot be delivered now are given up "
                "(not checkpointed: they are repeated from the last checkpoint on restart)"
            )
        self.stop_event.set()

    def run(self) -> int:
        """Run until stopped; returns the exit code (0 on a clean stop)."""
        started = self._started = time.monotonic()
        previous_handlers = {}
        if self.install_signal_handlers:
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous_handlers[signum] = signal.signal(signum, self.stop)
        try:
            config = self.config
            if config.metrics.enabled and self.metrics_port is None:
                self.metrics_port = self.metrics.serve(config.metrics.host, config.metrics.port)
            directory = Path(config.checkpoint.dir)
            with _locked(directory):
                self._store = CheckpointStore(directory, keep=config.checkpoint.keep)
                self.processor = self._restore()
                if not config.kafka.bootstrap_servers:
                    self.broker = EmbeddedBroker().start()
                    config.kafka.bootstrap_servers = self.broker.bootstrap_servers
                    log.warning(
                        "no kafka.bootstrap_servers configured: started the embedded broker at "
                        "%s (memory only: its topics vanish when the daemon stops)",
                        self.broker.bootstrap_servers,
                    )
                try:
                    if self._connect():
                        self._loop()
                finally:
                    self._shutdown()
        finally:
            for signum, handler in previous_handlers.items():
                signal.signal(signum, handler)
            if self.broker is not None:
                self.broker.stop()
            self.metrics.close()
            self.metrics_port = None
            self.summary.seconds = time.monotonic() - started
        return self.summary.exit_code

    # -- start -----------------------------------------------------------------------------

    def _restore(self) -> Processor:
        config = self.config
        assert self._store is not None
        settings = model_settings(config)

        def restore(checkpoint: Checkpoint) -> Any:
            saved = checkpoint.state.get("model_settings")
            if saved != settings:
                raise DaemonError(
                    f"it was made with model settings {saved}, but the configuration says "
                    f"{settings}; use another checkpoint.dir for a different model"
                )
            return restore_model(config, checkpoint.arrays, checkpoint.model_meta)

        try:
            checkpoint = self._store.load_latest(restore)
        except CheckpointError as exc:
            raise DaemonError(str(exc)) from exc
        model = checkpoint.restored if checkpoint is not None else build_model(config)
        processor = Processor(
            model,
            label_topic=config.kafka.label_topic,
            cache_max_size=config.cache.max_size,
            cache_max_age_seconds=config.cache.max_age_seconds,
            max_message_bytes=config.kafka.max_message_bytes,
            metrics=self.metrics,
        )
        if checkpoint is not None:
            processor.load_state(checkpoint.state["processor"])
            log.info(
                "restored checkpoint %s: %d model updates, next offsets %s",
                checkpoint.path,
                processor.updates,
                processor.offsets,
            )
        else:
            log.info("no checkpoint in %s: starting a new %s", config.checkpoint.dir, settings)
        return processor

    def _topics(self) -> list[str]:
        kafka = self.config.kafka
        return [kafka.input_topic] + ([kafka.label_topic] if kafka.label_topic else [])

    def _connect(self) -> bool:
        """Create the clients (retrying with backoff); False when stopped meanwhile."""
        from kafka import KafkaConsumer, KafkaProducer
        from kafka.errors import KafkaError

        config = self.config
        retry = config.retry
        backoff = _Backoff(
            retry.initial_backoff_seconds, retry.max_backoff_seconds, retry.max_attempts
        )
        client = kafka_client_settings(config)
        # kafka-python 3 blocks each client's construction for its own bootstrap_timeout_ms
        # (default 30 s, whatever request_timeout_ms says), reconnecting with its own backoff
        # up to 30 s: the retry.* settings, the retry log lines and a SIGTERM all waited for
        # that. One attempt now lasts request_timeout_ms, and no client backoff exceeds ours.
        client.update(
            bootstrap_timeout_ms=config.kafka.request_timeout_ms,
            reconnect_backoff_max_ms=max(50, int(retry.max_backoff_seconds * 1000)),
        )
        servers = ",".join(client["bootstrap_servers"])
        log.info("connecting to %s", servers)
        while not self.stop_event.is_set():
            try:
                if config.kafka.create_topics:
                    self._create_topics(client)
                consumer = KafkaConsumer(
                    **client,
                    group_id=config.kafka.group_id,
                    enable_auto_commit=False,
                    auto_offset_reset="earliest",
                    max_partition_fetch_bytes=max(1_048_576, config.kafka.max_message_bytes),
                    fetch_max_wait_ms=min(100, max(1, config.kafka.poll_timeout_ms)),
                )
                partitions = self._partitions(consumer)
                consumer.assign(partitions)
                self._seek(consumer, partitions)
                producer = KafkaProducer(
                    **client,
                    acks="all",
                    linger_ms=config.kafka.linger_ms,
                    max_request_size=max(1_048_576, 2 * config.kafka.max_message_bytes),
                    retries=2_147_483_647,
                    max_in_flight_requests_per_connection=1,
                )
            except (KafkaError, OSError, DaemonError) as exc:
                if self.metrics is not None:
                    self.metrics.broker_errors.inc()
                with contextlib.suppress(Exception):
                    consumer.close()  # type: ignore[possibly-undefined]
                backoff.wait(self.stop_event, f"broker at {servers} unreachable", exc)
                continue
            self._consumer, self._producer = consumer, producer
            log.info(
                "connected to %s: reading %s, writing %s and %s",
                servers,
                ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions),
                config.kafka.output_topic,
                config.kafka.dead_letter_topic,
            )
            return True
        return False

    def _create_topics(self, client: dict[str, Any]) -> None:
        kafka = self.config.kafka
        ensure_topics(
            client,
            [*self._topics(), kafka.output_topic, kafka.dead_letter_topic],
            kafka.topic_partitions,
        )

    def _partitions(self, consumer: Any) -> list[Any]:
        from kafka import TopicPartition

        partitions = []
        for topic in self._topics():
            found = None
            deadline = time.monotonic() + self.config.kafka.request_timeout_ms / 1000
            while found is None and time.monotonic() < deadline:
                consumer.topics()  # refreshes the metadata
                found = consumer.partitions_for_topic(topic)
                if found is None:
                    self.stop_event.wait(0.2)
            if not found:
                raise DaemonError(
                    f"topic {topic} does not exist (set kafka.create_topics = true to create it)"
                )
            partitions += [TopicPartition(topic, p) for p in sorted(found)]
        return partitions

    def _seek(self, consumer: Any, partitions: list[Any]) -> None:
        assert self.processor is not None
        for tp in partitions:
            name = f"{tp.topic}:{tp.partition}"
            if name in self.processor.offsets:
                consumer.seek(tp, self.processor.offsets[name])
                continue
            committed = consumer.committed(tp)
            if committed is not None and self._store is not None and not self._store.paths():
                # Outputs up to a committed offset are flushed; without a checkpoint the model
                # starts empty from there (a fresh model for an already-served stream).
                log.warning(
                    "no checkpoint but %s has the committed offset %d: the new model starts there",
                    name,
                    committed,
                )
                consumer.seek(tp, committed)
                self.processor.offsets[name] = committed
            else:
                consumer.seek_to_beginning(tp)

    # -- the loop --------------------------------------------------------------------------

    def _loop(self) -> None:
        from kafka.errors import KafkaError

        assert self.processor is not None
        config = self.config
        retry = config.retry
        backoff = _Backoff(retry.initial_backoff_seconds, retry.max_backoff_seconds, 0)
        while not self.stop_event.is_set():
            try:
                polled = self._consumer.poll(
                    timeout_ms=config.kafka.poll_timeout_ms, max_records=config.kafka.max_batch
                )
            except KafkaError as exc:
                self.metrics.broker_errors.inc()
                backoff.wait(self.stop_event, "poll failed", exc)
                continue
            records = [record for batch in polled.values() for record in batch]
            self._update_lag()
            if not records:
                if self.until_drained and self._drained():
                    log.info("every partition is read up to its high watermark: stopping")
                    break
                self._maybe_checkpoint()
                continue
            self._handle(records)
            backoff.reset()
            if self.on_batch is not None:
                self.on_batch(self)

    def _handle(self, records: list[Any]) -> None:
        assert self.processor is not None
        started = time.perf_counter()
        result = self.processor.process(records)
        kafka = self.config.kafka
        sends = [
            (kafka.output_topic, key, encode(value)) for key, value in result.outputs
        ] + [(kafka.dead_letter_topic, key, encode(value)) for key, value in result.dead_letters]
        if not self._deliver(sends):
            return  # given up on a second stop: this batch must not be checkpointed/committed
        now_ms = time.time() * 1000
        for timestamp in result.input_timestamps:
            if timestamp > 0:
                latency = max(0.0, (now_ms - timestamp) / 1000)
                self.latencies.append(latency)
                self.metrics.latency.observe(latency)
        summary = self.summary
        summary.messages += len(records) - result.skipped
        summary.outputs += len(result.outputs)
        summary.dead_letters += len(result.dead_letters)
        summary.skipped += result.skipped
        summary.batches += 1
        self._since_checkpoint += len(records) - result.skipped
        self.metrics.batch_size.observe(len(records))
        self.metrics.batch_seconds.observe(time.perf_counter() - started)
        self._maybe_checkpoint()
        if time.monotonic() - self._last_commit >= 1.0:
            self._commit()

    def _deliver(self, sends: list[tuple[str, bytes | None, bytes]]) -> bool:
        """Send and flush, retrying failed sends until every one is acknowledged (or stop is
        requested twice: outputs are then repeated from the last checkpoint on restart);
        returns whether every output was delivered."""
        from kafka.errors import KafkaError

        retry = self.config.retry
        backoff = _Backoff(retry.initial_backoff_seconds, retry.max_backoff_seconds, 0)
        while sends:
            # Without this, a broker that stays away kept the daemon retrying forever, deaf
            # to any number of SIGTERMs (the documented second stop was never honoured).
            if backoff.failures and self._stop_requests >= 2:
                self._undelivered = True
                log.error(
                    "gave up delivering %d outputs on the second stop request: the last "
                    "checkpoint stays, the stream is repeated from it on restart",
                    len(sends),
                )
                return False
            futures = []
            try:
                for topic, key, value in sends:
                    futures.append(self._producer.send(topic, key=key, value=value))
                self._producer.flush(timeout=self.config.kafka.request_timeout_ms / 1000)
            except KafkaError as exc:
                self.metrics.broker_errors.inc()
                failed = [s for s, f in zip(sends, futures, strict=False) if not f.succeeded()]
                failed += sends[len(futures) :]
                sends = failed
                backoff.wait(self.stop_event, f"could not deliver {len(sends)} outputs", exc)
                continue
            sends = [s for s, f in zip(sends, futures, strict=True) if not f.succeeded()]
            if sends:
                backoff.wait(
                    self.stop_event,
                    f"could not deliver {len(sends)} outputs",
                    RuntimeError("not acknowledged"),
                )
        return True

    def _update_lag(self) -> None:
        for tp in self._consumer.assignment():
            high = self._consumer.highwater(tp)
            if high is None:
                continue
            position = self._consumer.position(tp)
            self.metrics.lag.labels(topic=tp.topic, partition=str(tp.partition)).set(
                max(0, high - position)
            )

    def _drained(self) -> bool:
        for tp in self._consumer.assignment():
            high = self._consumer.highwater(tp)
            if high is None or self._consumer.position(tp) < high:
                return False
        return True

    # -- checkpoints and commits -----------------------------------------------------------

    def _maybe_checkpoint(self) -> None:
        due_messages = self._since_checkpoint >= self.config.checkpoint.every_messages
        due_time = time.monotonic() - self._last_checkpoint >= self.config.checkpoint.every_seconds
        if self._since_checkpoint and (due_messages or due_time):
            self.checkpoint()

    def checkpoint(self) -> None:
        """Write a checkpoint of the model and the processed offsets (outputs are flushed)."""
        assert self.processor is not None and self._store is not None
        started = time.perf_counter()
        arrays, meta = self.processor.model.to_checkpoint()
        state = {
            "model_settings": model_settings(self.config),
            "processor": self.processor.state(),
        }
        try:
            path = self._store.save(arrays, meta, state)
        except CheckpointError as exc:
            self.metrics.checkpoint_failures.inc()
            log.error("%s (the previous checkpoint stays in use)", exc)
            return
        self.metrics.checkpointed(time.perf_counter() - started)
        self._since_checkpoint = 0
        self._last_checkpoint = time.monotonic()
        self.summary.checkpoints += 1
        log.debug("checkpoint %s written", path)

    def _commit(self) -> None:
        from kafka import OffsetAndMetadata, TopicPartition
        from kafka.errors import KafkaError

        assert self.processor is not None
        offsets = {
            TopicPartition(name.rpartition(":")[0], int(name.rpartition(":")[2])): (
                OffsetAndMetadata(offset, "", -1)
            )
            for name, offset in self.processor.offsets.items()
            if self._committed.get(name) != offset
        }
        self._last_commit = time.monotonic()
        if not offsets:
            return
        try:
            self._consumer.commit(offsets)
        except KafkaError as exc:
            log.warning("offset commit failed (%s); retrying with the next batch", exc)
            return
        self._committed.update(
            {f"{tp.topic}:{tp.partition}": meta.offset for tp, meta in offsets.items()}
        )

    def _shutdown(self) -> None:
        if self._undelivered:
            self.summary.exit_code = 1  # an unclean stop: outputs are repeated on restart
        elif self.processor is not None and self._store is not None and self._since_checkpoint:
            self.checkpoint()
        if self._consumer is not None:
            if not self._undelivered:
                self._commit()
            with contextlib.suppress(Exception):
                self._consumer.close(autocommit=False)
        if self._producer is not None:
            with contextlib.suppress(Exception):
                self._producer.close(timeout=self.config.kafka.request_timeout_ms / 1000)
        self.summary.seconds = time.monotonic() - self._started
        if self.processor is not None:
            self.summary.accuracy = self.processor.accuracy
            self.summary.breakpoints = int(getattr(self.processor.model, "breakpoints_total", 0))
        log.info("stopped: %s", json.dumps(self.summary.__dict__, default=str))
