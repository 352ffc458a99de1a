"""Reports: read recorded results (never rerun or recompute acceptance) and render HTML, Markdown and PNGs.

``build_report(runs, out_dir)`` is the entry point; ``dspark_bench.report.cli`` holds the ``report`` and
``paper`` commands. Optional result files (profile.json, sweep.json, simulate.json, calibration.json,
lossless.json) are documented in :mod:`dspark_bench.report.inputs`.
"""

from dspark_bench.report.build import ReportResult, build_report
from dspark_bench.report.inputs import ReportError

__all__ = ["ReportError", "ReportResult", "build_report"]
