"""Pacing the label topic against the input topic.

Kafka orders messages within a partition only, and a consumer reading two topics fetches each
at its own pace: after a backlog (a restart, a rebalance, a slow daemon) the small messages of
``kafka.label_topic`` arrive much faster than the features they label, and a label handled
before its features finds nothing to label. The daemon therefore holds a label back, as Kafka
Streams holds back a join's faster side, while both of these are true:

- the label is newer (by its Kafka timestamp) than every input message read so far from an
  input partition its features may be in (the same partition index with ``model.scope``
  partition or key, whose label topic is co-partitioned; every input partition of a global
  model);
- that input partition has messages left to read (its position is below its high watermark,
  or no fetch has told its high watermark yet).

A label whose features were sent before it is then read after them. An input partition that
has not moved for :attr:`LabelPacer.wait_seconds` while labels waited for it (its leader is
gone, the broker answers its fetches empty) no longer holds them back: the stream of labels
must not stop for it, and a label that comes first is dead-lettered ``unknown_id`` as before,
with the label in it to send again. Labels without a timestamp (``-1``) are never held.

The pacer only decides; the daemon pauses a held label partition at its first held offset
(nothing of it is handled or committed) and resumes it once :meth:`LabelPacer.releasable`
names it.

>>> from connectors.processor import Record
>>> pacer = LabelPacer("in", "labels", per_partition=False, clock=lambda: 0.0)
>>> polled = [Record("in", 0, 0, b"", 1000), Record("labels", 0, 0, b"", 5000)]
>>> ready, held = pacer.split(polled, {0: (1, 40)})   # 39 input messages still to read
>>> [r.topic for r in ready], held
(['in'], {0: 0})
>>> pacer.releasable({0: (40, 40)})                    # the input is read to its end
[0]
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = ["InputPositions", "LabelPacer"]

log = logging.getLogger(__name__)

#: Per input partition: (position, high watermark); None where the client does not know it.
InputPositions = Mapping[int, tuple[int | None, int | None]]


class LabelPacer:
    """Decides which label records wait until the input topic has been read up to them.

    ``per_partition``: a label of partition *p* labels features of input partition *p* only
    (scoped models); otherwise features of any input partition (a global model). ``clock``
    (seconds, monotonic) times how long an input partition has not moved.

    Thread-safe: the consumer's rebalance listeners call :meth:`forget`.
    """

    #: An input partition with messages to read that has not moved for this long while labels
    #: waited for it no longer holds labels back.
    wait_seconds = 60.0

    def __init__(self, input_topic: str, label_topic: str, *, per_partition: bool,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.input_topic = input_topic
        self.label_topic = label_topic
        self.per_partition = per_partition
        self.clock = clock
        self._lock = threading.Lock()
        #: input partition -> newest timestamp of its messages handed to the model(s)
        self._delivered: dict[int, int] = {}
        #: label partition -> timestamp of its first held label
        self._held: dict[int, int] = {}
        #: input partition -> (position, since when) while labels wait for it
        self._progress: dict[int, tuple[int | None, float]] = {}
        #: input partitions found not moving, warned of (until they move)
        self._stuck: set[int] = set()

    @property
    def held(self) -> dict[int, int]:
        """Label partition -> the timestamp of its first held label."""
        with self._lock:
            return dict(self._held)

    def split(self, records: Sequence[Any], inputs: InputPositions
              ) -> tuple[list[Any], dict[int, int]]:
        """The records to handle now, in their order, and per label partition the offset of
        its first held label (that label and every later one of its partition wait).

        ``inputs``: the positions and high watermarks of the input partitions assigned, as
        they are once this poll's records are read. The input records of the poll count as
        read (they are handled before the labels of the poll)."""
        with self._lock:
            delivered = dict(self._delivered)
            for record in records:
                if record.topic == self.input_topic:
                    delivered[record.partition] = max(delivered.get(record.partition, -1),
                                                      record.timestamp)
            held: dict[int, int] = {}
            ready: list[Any] = []
            for record in records:
                if record.topic != self.label_topic:
                    ready.append(record)
                elif record.partition in held:
                    continue  # behind a held label of its partition: it waits too
                elif self._waits(record.partition, record.timestamp, inputs, delivered):
                    held[record.partition] = record.offset
                    self._held[record.partition] = record.timestamp
                else:
                    ready.append(record)
            if not self._held:
                self._progress.clear()
            return ready, held

    def releasable(self, inputs: InputPositions) -> list[int]:
        """The held label partitions whose first held label need not wait any more (they are
        no longer held: resume them)."""
        with self._lock:
            released = [partition for partition, timestamp in self._held.items()
                        if not self._waits(partition, timestamp, inputs, self._delivered)]
            for partition in released:
                del self._held[partition]
            if not self._held:
                self._progress.clear()
            return released

    def delivered(self, records: Iterable[Any], read_again: Mapping[str, int]) -> None:
        """Note the input records handled (those at or past an offset of ``read_again``,
        ``"topic:partition"`` -> offset, will be read again: not yet)."""
        with self._lock:
            for record in records:
                if record.topic != self.input_topic:
                    continue
                again = read_again.get(f"{record.topic}:{record.partition}", math.inf)
                if record.offset < again:
                    self._delivered[record.partition] = max(
                        self._delivered.get(record.partition, -1), record.timestamp)

    def forget(self, partitions: Iterable[int]) -> None:
        """The partitions (of both topics) were taken away or given anew: what was read of
        them tells nothing of where they are read from next."""
        with self._lock:
            for partition in partitions:
                self._delivered.pop(partition, None)
                self._held.pop(partition, None)
                self._progress.pop(partition, None)
                self._stuck.discard(partition)

    # -- one label -------------------------------------------------------------------------

    def _waits(self, partition: int, timestamp: int, inputs: InputPositions,
               delivered: Mapping[int, int]) -> bool:
        if timestamp < 0:
            return False  # no timestamp to compare
        sources = ([partition] if partition in inputs else []) if self.per_partition \
            else list(inputs)
        waits = False
        for source in sources:
            if delivered.get(source, -1) >= timestamp:
                continue  # read up to the label
            position, high = inputs[source]
            if position is not None and high is not None and position >= high:
                self._progress.pop(source, None)
                continue  # read to its end: the label's features are not coming from there
            if self._not_moving(source, position):
                continue
            waits = True
        return waits

    def _not_moving(self, source: int, position: int | None) -> bool:
        now = self.clock()
        seen = self._progress.get(source)
        if seen is None or seen[0] != position:
            self._progress[source] = (position, now)
            if source in self._stuck:
                self._stuck.discard(source)
                log.info("input partition %s:%d moves again: late labels wait for it again",
                         self.input_topic, source)
            return False
        if now - seen[1] < self.wait_seconds:
            return False
        if source not in self._stuck:
            self._stuck.add(source)
            log.warning("input partition %s:%d has messages to read but has not moved for "
                        "%.0f s: late labels on %s no longer wait for it (a label whose "
                        "features it still holds is dead-lettered unknown_id, to send again)",
                        self.input_topic, source, now - seen[1], self.label_topic)
        return True
