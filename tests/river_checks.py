"""River's own estimator checks, run on an estimator of the package."""

from __future__ import annotations

from typing import Any

from river import checks


def run_river_checks(estimator: Any, at_least: int) -> None:
    """Run every check River yields for ``estimator`` on fresh clones, except those its
    ``_unit_test_skips()`` names (with the reason given there); ``at_least`` guards against
    a River version that silently yields fewer."""
    skips = estimator._unit_test_skips() if hasattr(estimator, "_unit_test_skips") else set()
    ran = 0
    for check in checks.yield_checks(estimator):
        if check.__name__ in skips:
            continue
        check(estimator.clone())
        ran += 1
    assert ran >= at_least, f"only {ran} of River's checks ran"
