"""Pacing the label topic against the input topic.

Kafka orders messages within a partition only, and a consumer reading two topics fetches each
at its own pace: after a backlog (a restart, a rebalance, a slow daemon) the small messages of
``kafka.label_topic`` arrive much faster than the features they label, and a label handled
before its features finds nothing to label. The daemon therefore holds a label back, as Kafka
Streams holds back a join's faster side, while both of these are true:

- the label is not older (by its Kafka timestamp) than what was read so far of an input
  partition its features may be in (the same partition index with ``model.scope`` partition
  or key, whose label topic is co-partitioned; every input partition of a global model):
  what was read there is older than the label, or as old (another message of the same
  millisecond may follow);
- that input partition has messages left to read: its position is below its high watermark,
  or no fetch has told its high watermark yet, or the broker's end offset (asked for when the
  client's high watermark says the partition is read to its end: the client updates it only
  as it hands out what it fetched) lies past the position.

A label whose features were sent before it is then read after them. An input partition that
has not moved for :attr:`LabelPacer.wait_seconds` while labels waited for it (its leader is
gone, the broker answers its fetches empty) no longer holds them back: the stream of labels
must not stop for it, and a label that comes first is dead-lettered ``unknown_id`` as before,
with the label in it to send again. Labels without a timestamp (``-1``) or stamped more than
:attr:`LabelPacer.future_seconds` ahead of this machine's clock (a producer's clock that runs
ahead: it would hold its partition until the input caught up with that clock) never wait.

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

__all__ = ["EndOffsets", "InputPositions", "LabelPacer"]

log = logging.getLogger(__name__)

#: Per input partition: (position, high watermark); None where the client does not know it.
InputPositions = Mapping[int, tuple[int | None, int | None]]
#: The broker's end offsets of input partitions (None: not known), asked for only when the
#: client's high watermark says a partition is read to its end.
EndOffsets = Callable[[list[int]], Mapping[int, int | None]]


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
    #: A label stamped more than this ahead of this machine's clock never waits.
    future_seconds = 300.0

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

    def split(self, records: Sequence[Any], inputs: InputPositions,
              end_offsets: EndOffsets | None = None) -> tuple[list[Any], dict[int, int]]:
        """The records to handle now, in their order, and per label partition the offset of
        its first held label (that label and every later one of its partition wait).

        ``inputs``: the positions and high watermarks of the input partitions assigned, as
        they are once this poll's records are read. The input records of the poll count as
        read (they are handled before the labels of the poll). ``end_offsets``: see
        :data:`EndOffsets` (without it, the high watermark is taken as it is)."""
        with self._lock:
            delivered = dict(self._delivered)
            for record in records:
                if record.topic == self.input_topic:
                    delivered[record.partition] = max(delivered.get(record.partition, -1),
                                                      record.timestamp)
            labels = [(r.partition, r.timestamp) for r in records if r.topic == self.label_topic]
            # (The held labels too: what they wait for stays watched, so that an input
            # partition that does not move is timed from when they began to wait.)
            floors = self._floors(labels + list(self._held.items()), inputs, delivered,
                                  end_offsets)
            held: dict[int, int] = {}
            ready: list[Any] = []
            for record in records:
                if record.topic != self.label_topic:
                    ready.append(record)
                elif record.partition in held:
                    continue  # behind a held label of its partition: it waits too
                elif self._waits(record.partition, record.timestamp, floors):
                    held[record.partition] = record.offset
                    self._held[record.partition] = record.timestamp
                else:
                    ready.append(record)
            return ready, held

    def releasable(self, inputs: InputPositions,
                   end_offsets: EndOffsets | None = None) -> list[int]:
        """The held label partitions whose first held label need not wait any more (they are
        no longer held: resume them)."""
        with self._lock:
            floors = self._floors(list(self._held.items()), inputs, self._delivered,
                                  end_offsets)
            released = [partition for partition, timestamp in self._held.items()
                        if not self._waits(partition, timestamp, floors)]
            for partition in released:
                del self._held[partition]
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

    # -- deciding ------------------------------------------------------------------------------

    def _floors(self, labels: list[tuple[int, int]], inputs: InputPositions,
                delivered: Mapping[int, int], end_offsets: EndOffsets | None
                ) -> dict[int, int]:
        """Per input partition that holds labels back (messages left to read, moving): the
        newest timestamp read of it. A label waits for one whose timestamp it is not older
        than. Only the partitions some of ``labels`` (partition, timestamp) could wait for
        are looked at, and the broker asked for the end offsets of those that seem read to
        their end."""
        limit = (time.time() + self.future_seconds) * 1000
        newest: dict[int, int] = {}  # input partition -> the newest label that may wait for it
        for partition, timestamp in labels:
            if timestamp < 0 or timestamp > limit:
                continue
            for source in self._sources(partition, inputs):
                newest[source] = max(newest.get(source, -1), timestamp)
        floors: dict[int, int] = {}
        seem_read: list[int] = []
        watched: set[int] = set()  # (whether they move)
        for source, timestamp in newest.items():
            read = delivered.get(source, -1)
            if read > timestamp:
                continue  # read past every label that may wait for it
            position, high = inputs[source]
            if position is not None and high is not None and position >= high:
                if source in self._stuck and self._progress.get(source, (None,))[0] == position:
                    watched.add(source)  # (still stuck: not asked of the broker again)
                    continue
                seem_read.append(source)
                continue
            watched.add(source)
            if not self._not_moving(source, position):
                floors[source] = read
        if seem_read and end_offsets is not None:
            try:
                ends = end_offsets(seem_read)
            except Exception as exc:  # (the stream must not stop for it: as read to its end)
                log.debug("the end offsets of %s are not known: %s", seem_read, exc)
                ends = {}
            for source in seem_read:
                end, position = ends.get(source), inputs[source][0]
                if end is not None and position is not None and end > position:
                    watched.add(source)
                    if not self._not_moving(source, position):
                        floors[source] = delivered.get(source, -1)
        for source in set(self._progress) - watched - self._stuck:
            del self._progress[source]  # (not waited for now: a later wait times anew)
        return floors

    def _sources(self, partition: int, inputs: InputPositions) -> list[int]:
        """The input partitions a label of ``partition`` may label features of."""
        if self.per_partition:
            return [partition] if partition in inputs else []
        return list(inputs)

    def _waits(self, partition: int, timestamp: int, floors: Mapping[int, int]) -> bool:
        if timestamp < 0 or timestamp > (time.time() + self.future_seconds) * 1000:
            return False
        if self.per_partition:
            return partition in floors and timestamp >= floors[partition]
        return bool(floors) and timestamp >= min(floors.values())

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
