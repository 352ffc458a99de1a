"""The lossless test battery: statistics (pure), synthetic Markov models, exact enumeration, negative controls.

Entry point: :func:`run_battery` (``dspark-bench check-lossless``). Modules:

* :mod:`.hypothesis`, :mod:`.power`: the pure statistics (chi-square with pooling, homogeneity, randomized PIT,
  KS, Holm; noncentral chi-square power and sample size).
* :mod:`.synthetic`: a Markov target and drafter behind the engine's interfaces; :mod:`.exact`: their exact
  output laws by enumeration; :mod:`.controls`: deliberately lossy rules, drafters and schedulers.
* :mod:`.cases`, :mod:`.checks`, :mod:`.battery`, :mod:`.report`: the battery itself.
"""

from dspark_bench.lossless.battery import PLANS, Plan, run_battery
from dspark_bench.lossless.report import HEADERS, BatteryReport, TestResult, render_rows, report_to_json

__all__ = ["HEADERS", "PLANS", "BatteryReport", "Plan", "TestResult", "render_rows", "report_to_json", "run_battery"]
