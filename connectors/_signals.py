"""The signals that stop the daemon, known without importing it (the command line holds them
while the daemon's modules load)."""

from __future__ import annotations

import signal


def stop_signals() -> tuple[int, ...]:
    """SIGTERM, SIGINT and SIGHUP, unless SIGHUP is ignored (``nohup``: the daemon must
    outlive the terminal it was started from)."""
    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        return (signal.SIGTERM, signal.SIGINT)
    return (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
