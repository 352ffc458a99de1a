"""Static PNG export of the figures, when an exporter is installed: kaleido (``pip install kaleido``) driving a
Chrome or Chromium (on Debian: ``apt-get install -y chromium``; kaleido finds it on PATH, or set BROWSER_PATH).
It is optional: without it the report says so once and still writes index.html and report.md."""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import plotly.graph_objects as go

log = logging.getLogger(__name__)
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
PNG_WIDTH = 1100


def find_browser() -> str | None:
    """The Chrome/Chromium kaleido would drive: BROWSER_PATH if set, else the first on PATH."""
    if os.environ.get("BROWSER_PATH"):
        return os.environ["BROWSER_PATH"]
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def unavailable_reason() -> str | None:
    """Why PNGs cannot be written here (None when they can)."""
    if importlib.util.find_spec("kaleido") is None:
        return "PNG export skipped: kaleido is not installed (pip install kaleido; it also needs Chromium)"
    if find_browser() is None:
        return ("PNG export skipped: kaleido found no Chrome/Chromium (apt-get install -y chromium, "
                "or set BROWSER_PATH)")
    return None


def export_pngs(figures: Sequence[tuple[Path, go.Figure]]) -> str | None:
    """Write each figure to its path in one browser session; returns why it failed, or None on success."""
    reason = unavailable_reason()
    if reason or not figures:
        return reason
    import kaleido

    jobs = [{"fig": fig, "path": str(path),
             "opts": {"width": PNG_WIDTH, "height": int(fig.layout.height or 450), "format": "png"}}
            for path, fig in figures]
    for path, _ in figures:
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        kaleido.write_fig_from_object_sync(jobs)
    except Exception as exc:  # noqa: BLE001 - a static exporter must never fail the report
        log.warning("PNG export failed: %s", exc)
        return f"PNG export failed ({type(exc).__name__}: {exc})"
    missing = [str(p) for p, _ in figures if not p.is_file()]
    return f"PNG export wrote no file for {', '.join(missing)}" if missing else None
