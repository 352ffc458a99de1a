"""Reports: read recorded results (never rerun or recompute acceptance) and render HTML, Markdown and PNGs.
Relative gains carry 95% intervals resampled from the runs' recorded per-prompt numbers, or are withheld
(:mod:`dspark_bench.report.gains`).

``build_report(runs, out_dir)`` is the entry point; ``dspark_bench.cli.report`` holds the ``report`` and
``paper`` commands. Optional result files (profile.json, sweep.json, simulate.json, calibration.json,
lossless.json) are documented in :mod:`dspark_bench.report.inputs`.
"""

from dspark_bench.report.inputs import ReportError

__all__ = ["ReportError", "ReportResult", "build_report"]


def __getattr__(name: str):
    """``build_report`` and ``ReportResult`` import plotly: loaded on first use, so that importing the package
    (the CLI does, to attach its commands) works where plotly is not installed."""
    if name in ("ReportResult", "build_report"):
        from dspark_bench.report import build

        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
