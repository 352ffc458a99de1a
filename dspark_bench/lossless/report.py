"""Results of the lossless battery: one :class:`TestResult` per (test, configuration), a :class:`BatteryReport`,
the verdict rule (Holm over the real family) and the table / JSON views of a report.

Verdicts:

* ``exact`` rows compare an enumerated law with the target law: pass iff ``max |difference| <= bound`` (1e-9).
* sampled rows of real configurations: Holm step-down over all of them at ``alpha``; a rejected one fails.
* sampled rows of negative controls: a control is *detected* (verdict "fail", as expected) iff its p-value is
  below ``alpha / (m + 1)``, m = size of the real family: the level at which Holm would reject it first had it
  been one more member of that family.
* a configuration that raised fails, with the error in ``detail``.
* a row made ``inconclusive`` (a check that sampled too little of what it tests to state its power) or ``n/a``
  (shown, not judged) stays so, out of the Holm family; a report with one is not ok, and says so (:attr:`BatteryReport.verdict`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from dspark_bench.lossless.hypothesis import holm

ALPHA = 1e-3
EXACT_BOUND = 1e-9
HEADERS = ("test", "configuration", "n", "statistic", "p / bound", "Holm p", "verdict", "expected", "n for power .99",
           "detail")


@dataclass(frozen=True)
class TestResult:
    """One test of one configuration.

    n: sequences or tokens sampled (exact rows: enumerated output sequences).
    statistic: chi-square, KS D, or the max abs law error (exact rows); nan when the configuration failed to run.
    p_value: raw p-value of a sampled test; None for exact rows. bound: the tolerance of exact rows.
    power_n: for controls, the sample size at which the same test reaches power 0.99 at ``ALPHA``.
    """

    __test__ = False  # not a pytest class

    test: str
    configuration: str
    n: int
    statistic: float
    p_value: float | None = None
    bound: float | None = None
    verdict: str = "fail"
    is_control: bool = False
    expected: str = "pass"
    adjusted_p: float | None = None
    df: int | None = None
    power_n: int | None = None
    detail: str = ""


@dataclass(frozen=True)
class BatteryReport:
    mode: str
    target: str
    dtype: str
    seed: int
    alpha: float
    seconds: float
    results: tuple[TestResult, ...]

    @property
    def ok(self) -> bool:
        """Every real configuration passes and every control fails."""
        return bool(self.results) and all(r.verdict == r.expected for r in self.results)

    @property
    def verdict(self) -> str:
        """``ok``; ``fail`` when a row did not give its expected verdict for another reason than too little
        evidence; else ``inconclusive``."""
        if self.ok:
            return "ok"
        wrong = [r for r in self.results if r.verdict != r.expected]
        return "inconclusive" if wrong and all(r.verdict == "inconclusive" for r in wrong) else "fail"


def errored(test: str, configuration: str, exc: BaseException, is_control: bool = False) -> TestResult:
    return TestResult(test, configuration, 0, math.nan, verdict="fail", is_control=is_control,
                      expected="fail" if is_control else "pass", detail=f"error: {type(exc).__name__}: {exc}")


def finalize(results: list[TestResult], alpha: float = ALPHA) -> tuple[TestResult, ...]:
    """Set every verdict (module docstring)."""
    family = [i for i, r in enumerate(results)
              if not r.is_control and r.p_value is not None and r.verdict not in ("inconclusive", "n/a")]
    rejected, adjusted = holm([results[i].p_value for i in family], alpha)
    holm_of = {i: (rej, adj) for i, rej, adj in zip(family, rejected, adjusted, strict=True)}
    control_level = alpha / (len(family) + 1)
    out = []
    for i, r in enumerate(results):
        if r.detail.startswith("error:") or r.verdict in ("inconclusive", "n/a"):
            out.append(r)
        elif r.p_value is None:
            out.append(dataclasses.replace(r, verdict="pass" if r.statistic <= (r.bound or 0.0) else "fail"))
        elif r.is_control:
            out.append(dataclasses.replace(r, verdict="fail" if r.p_value <= control_level else "pass"))
        else:
            rej, adj = holm_of[i]
            out.append(dataclasses.replace(r, verdict="fail" if rej else "pass", adjusted_p=adj))
    return tuple(out)


def _num(x: float | None, digits: int = 3) -> str:
    if x is None:
        return ""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:.{digits}g}"


def render_rows(report: BatteryReport) -> list[tuple[str, ...]]:
    """Rows of the CLI table, in the order of :data:`HEADERS`."""
    rows = []
    for r in report.results:
        bound = _num(r.p_value) if r.p_value is not None else (f"<= {r.bound:g}" if r.bound is not None else "")
        rows.append((
            r.test, r.configuration, str(r.n), _num(r.statistic), bound, _num(r.adjusted_p),
            r.verdict, r.expected + (" (control)" if r.is_control else ""),
            "" if r.power_n is None else str(r.power_n), r.detail,
        ))
    return rows


def _json_float(x):
    return x if not isinstance(x, float) or math.isfinite(x) else str(x)


def report_to_json(report: BatteryReport) -> dict:
    """A JSON-safe dict (non-finite floats become the strings "inf" / "nan")."""
    results = [{k: _json_float(v) for k, v in dataclasses.asdict(r).items()} for r in report.results]
    head = {k: v for k, v in dataclasses.asdict(report).items() if k != "results"}
    return {**head, "ok": report.ok, "verdict": report.verdict, "rows": results}
