"""Helpers shared by the benchmark scripts: output files, markdown tables, data, machine info."""

from __future__ import annotations

import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "benchmarks" / "out"  # git-ignored: raw tables of every run
FIGURES_DIR = ROOT / "benchmarks" / "figures"  # committed: the plots cited in the report
FISHER_DIR = ROOT.parent / "shared" / "data" / "fisher-river"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table; floats are printed with 4 significant digits."""

    def cell(value: Any) -> str:
        if isinstance(value, float | np.floating):
            if value == 0 or np.isnan(value):
                return f"{value:g}"
            if abs(value) >= 1e4 or abs(value) < 1e-3:
                return f"{value:.3e}"
            return f"{value:.4g}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def emit(name: str, text: str) -> Path:
    """Print a report and write it to benchmarks/out/<name>.md."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"{name}.md"
    path.write_text(text + "\n")
    print(text, flush=True)
    print(f"\n[written to {path.relative_to(ROOT)}]", flush=True)
    return path


def timed(function: Callable[[], Any]) -> tuple[Any, float]:
    """(result, wall seconds) of one call."""
    started = time.perf_counter()
    result = function()
    return result, time.perf_counter() - started


def load_fisher() -> tuple[np.ndarray, np.ndarray] | None:
    """The Fisher river task (1454 x 21, min-max scaled), or None with a message when absent."""
    if not (FISHER_DIR / "fisher.dat").exists():
        print(f"Fisher river data not found at {FISHER_DIR}: skipping the river-flow part.",
              flush=True)
        return None
    from stream_svm.datasets import load_river_flow

    X, y, _ = load_river_flow(FISHER_DIR, river="fisher")
    return X, y


def machine_info() -> str:
    """CPU, core count and library versions, as a markdown code block."""
    import scipy
    import sklearn

    try:
        cpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        cpu = "\n".join(cpu.splitlines()[:20])
    except OSError:
        cpu = platform.processor()
    try:
        cores = subprocess.run(["nproc"], capture_output=True, text=True, check=False).stdout
    except OSError:
        cores = "?"
    return (
        "```\n"
        f"{cpu}\nnproc: {cores.strip()}\n"
        f"python {sys.version.split()[0]}, numpy {np.__version__}, scipy {scipy.__version__}, "
        f"scikit-learn {sklearn.__version__}\n"
        "```"
    )


def limit_blas_threads() -> Any:
    """Run BLAS on one thread, like libsvm, so both sides get one core (and the 2-core
    machine keeps a core for anything else running); keep the returned object alive."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1)
