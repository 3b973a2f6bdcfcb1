r"""Tolerances, error statistics and the :class:`EquivarianceReport` table.

Errors are measured per *check* (rotation, translation, ...), *output* and
*component* (degree ``l``). For a transform ``g`` with action ``rho(g)`` on
the output, the error is ``f(g x) - rho(g) f(x)``:

* ``max abs``: the largest entry over every evaluated transform (worst case,
  including the rotations found by the local search),
* ``mean abs``: the mean entry over the *typical* transforms only (random
  ones, not the search),
* ``rel``: abs divided by the output's scale ``max |f(x)|`` (over the whole
  output, all degrees, so a tiny degree block does not inflate it).

A row passes when ``max abs <= atol + rtol * scale`` (like ``torch.allclose``
with the scale of the whole output).
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping

import torch

__all__ = ["Tolerance", "default_tolerance", "CheckRow", "EquivarianceReport"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tolerance:
    """Pass when ``max_abs <= atol + rtol * scale`` (``scale = max |reference output|``)."""

    rtol: float
    atol: float

    def bound(self, scale: float) -> float:
        return self.atol + self.rtol * scale


#: defaults for layers and models that are exactly equivariant in exact arithmetic
_DEFAULTS = {
    torch.float64: Tolerance(rtol=1e-10, atol=1e-12),
    torch.float32: Tolerance(rtol=1e-4, atol=1e-6),
    torch.float16: Tolerance(rtol=1e-2, atol=1e-3),
    torch.bfloat16: Tolerance(rtol=3e-2, atol=1e-3),
}


def default_tolerance(dtype: torch.dtype | None = None) -> Tolerance:
    """Tolerance for exactly equivariant code evaluated in ``dtype`` (default: torch's default dtype).

    float64: ``rtol=1e-10`` (a few hundred ulps after a deep network; a
    symmetry break of 1e-4 is six orders above it); float32: ``rtol=1e-4``.
    Sampled layers (grids that are not exact quadratures) have a genuine
    error: pass their stated bound as ``tol=``.
    """
    dtype = dtype or torch.get_default_dtype()
    if dtype not in _DEFAULTS:
        raise ValueError(f"no default tolerance for dtype {dtype}; pass tol= explicitly")
    return _DEFAULTS[dtype]


def make_tolerance(tol: float | Tolerance | None, atol: float | None, dtype: torch.dtype) -> Tolerance:
    """``tol`` (a relative tolerance or a Tolerance) and ``atol`` over the dtype default."""
    base = default_tolerance(dtype)
    if isinstance(tol, Tolerance):
        base = tol
    elif tol is not None:
        if not (isinstance(tol, (int, float)) and tol >= 0):
            raise ValueError(f"tol must be a non-negative relative tolerance, got {tol!r}")
        base = Tolerance(rtol=float(tol), atol=base.atol)
    if atol is not None:
        base = Tolerance(rtol=base.rtol, atol=float(atol))
    return base


@dataclasses.dataclass(kw_only=True)
class CheckRow:
    """Error statistics of one (check, output, component)."""

    check: str
    output: str
    component: str
    max_abs: float = 0.0
    mean_abs: float = 0.0
    scale: float = 0.0
    rtol: float = 0.0
    atol: float = 0.0
    expected: bool = True  # False: informational (e.g. reflection of an SE(3) model)
    worst: str = ""  # the transform that produced max_abs
    samples: int = 0

    @property
    def max_rel(self) -> float:
        return self.max_abs / self.scale if self.scale > 0 else (0.0 if self.max_abs == 0 else math.inf)

    @property
    def mean_rel(self) -> float:
        return self.mean_abs / self.scale if self.scale > 0 else (0.0 if self.mean_abs == 0 else math.inf)

    def passes(self, rtol: float | None = None, atol: float | None = None) -> bool:
        rtol = self.rtol if rtol is None else rtol
        atol = self.atol if atol is None else atol
        return bool(self.max_abs <= atol + rtol * self.scale)  # NaN fails

    @property
    def ok(self) -> bool:
        return self.passes()

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(max_rel=self.max_rel, mean_rel=self.mean_rel, ok=self.ok)
        return d


class _Stats:
    """Running statistics for one CheckRow."""

    def __init__(self, row: CheckRow) -> None:
        self.row = row
        self.sums = {True: 0.0, False: 0.0}
        self.counts = {True: 0, False: 0}

    def update(self, diff: torch.Tensor, describe, typical: bool) -> float:
        d = diff.detach().abs().to(torch.float64)
        m = float(d.max()) if d.numel() else 0.0
        mean = float(d.mean()) if d.numel() else 0.0
        row = self.row
        row.samples += 1
        if row.samples == 1 or m > row.max_abs or math.isnan(m):
            if not math.isnan(row.max_abs):
                row.max_abs = m
                row.worst = describe() if callable(describe) else str(describe)
        self.sums[typical] += mean
        self.counts[typical] += 1
        key = True if self.counts[True] else False
        row.mean_abs = self.sums[key] / self.counts[key]
        bound = row.atol + row.rtol * row.scale
        if math.isnan(m):
            return math.inf
        return m / bound if bound > 0 else (math.inf if m > 0 else 0.0)


class Recorder:
    """Compares transformed outputs with the transformed reference, for one check.

    ``reference``: ``{name: (tensor, Rep)}``; ``record(got, expected, ...)``
    updates one row per (output, component) and returns the worst
    tolerance ratio ``max_abs / (atol + rtol * scale)`` of this evaluation.
    """

    def __init__(
        self,
        check: str,
        reference: Mapping[str, tuple[torch.Tensor, Any]],
        tol: Tolerance | Mapping[str, Tolerance],
        *,
        expected: bool = True,
    ) -> None:
        self.check = check
        self.stats: dict[tuple[str, str], _Stats] = {}
        self.reps = {k: rep for k, (_, rep) in reference.items()}
        for name, (t, rep) in reference.items():
            scale = float(t.detach().abs().max()) if t.numel() else 0.0
            tl = tol[name] if isinstance(tol, Mapping) else tol
            for comp, _ in rep.components(t):
                self.stats[(name, comp)] = _Stats(
                    CheckRow(check=check, output=name, component=comp, scale=scale, rtol=tl.rtol, atol=tl.atol, expected=expected)
                )

    def record(self, got: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], describe, typical: bool) -> float:
        from ._reps import single_thread

        with single_thread():
            return self._record(got, expected, describe, typical)

    def _record(self, got: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], describe, typical: bool) -> float:
        worst = 0.0
        for name, rep in self.reps.items():
            g, e = got[name], expected[name]
            if g.shape != e.shape:
                raise AssertionError(
                    f"{self.check}: output {name!r} changed shape under the transform: {tuple(e.shape)} -> {tuple(g.shape)}"
                )
            diff = g.detach().to(torch.float64) - e.detach().to(torch.float64)
            for comp, part in rep.components(diff):
                r = self.stats[(name, comp)].update(part, describe, typical)
                worst = r if (math.isnan(r) or r > worst) else worst
        return worst

    def rows(self) -> list[CheckRow]:
        return [s.row for s in self.stats.values()]


def _fmt(v: float) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return str(v)
    return f"{v:.2e}"


class EquivarianceReport:
    """Errors of one layer or model under symmetry transforms.

    ``str(report)`` is a table; :meth:`assert_ok` raises ``AssertionError``
    naming every failing row (check, output, degree, error, worst transform);
    :meth:`to_dict` is JSON-ready. Rows with ``expected=False`` (reflections
    of SE(3) models) are reported but never fail.
    """

    def __init__(self, rows: list[CheckRow], *, title: str = "", dtype: torch.dtype | None = None, meta: dict | None = None) -> None:
        self.rows = list(rows)
        self.title = title
        self.dtype = dtype
        self.meta = dict(meta or {})

    def __repr__(self) -> str:
        return f"EquivarianceReport({self.title!r}, {len(self.rows)} rows, ok={self.ok})"

    def __str__(self) -> str:
        return self.table()

    @property
    def checks(self) -> list[str]:
        return list(dict.fromkeys(r.check for r in self.rows))

    def row(self, check: str, output: str, component: str | None = None) -> CheckRow:
        for r in self.rows:
            if r.check == check and r.output == output and (component is None or r.component == component):
                return r
        raise KeyError(f"no row for check={check!r}, output={output!r}, component={component!r}; checks: {self.checks}")

    def max_rel(self, check: str | None = None, output: str | None = None) -> float:
        """Largest relative error over the rows matching ``check`` / ``output``."""
        vals = [r.max_rel for r in self.rows if (check is None or r.check == check) and (output is None or r.output == output)]
        return max(vals) if vals else 0.0

    def _tol_for(self, row: CheckRow, tol: Any) -> float | None:
        if tol is None or isinstance(tol, (int, float)):
            return tol
        family = row.check.split("_")[0] if row.check.startswith("supercell") else row.check
        for key in (f"{row.check}/{row.output}", f"{family}/{row.output}", row.check, family, row.output):
            if key in tol:
                return tol[key]
        return None

    def failures(self, tol: float | Mapping[str, float] | None = None, atol: float | None = None) -> list[CheckRow]:
        """Rows that fail (informational rows never do); ``tol`` overrides rtol (a float, or a dict
        keyed by ``"check/output"``, ``"check"`` or ``"output"``)."""
        return [r for r in self.rows if r.expected and not r.passes(self._tol_for(r, tol), atol)]

    @property
    def ok(self) -> bool:
        return not self.failures()

    def assert_ok(self, tol: float | Mapping[str, float] | None = None, atol: float | None = None) -> "EquivarianceReport":
        """Raise ``AssertionError`` listing each failing row; returns ``self`` otherwise."""
        bad = self.failures(tol, atol)
        if bad:
            lines = [f"{self.title or 'equivariance check'}: {len(bad)} failing row(s)"]
            for r in bad:
                rt = self._tol_for(r, tol)
                rt = r.rtol if rt is None else rt
                at = r.atol if atol is None else atol
                lines.append(
                    f"  {r.check}: output {r.output!r} {r.component}: max abs error {_fmt(r.max_abs)} "
                    f"(relative {_fmt(r.max_rel)} of output scale {_fmt(r.scale)}) > atol {_fmt(at)} + rtol {_fmt(rt)} * scale; "
                    f"worst transform: {r.worst}"
                )
            lines.append("Full table:\n" + self.table())
            raise AssertionError("\n".join(lines))
        return self

    def table(self) -> str:
        head = ("check", "output", "l", "max abs", "mean abs", "max rel", "mean rel", "rtol", "status")
        body = []
        for r in self.rows:
            status = ("ok" if r.ok else "FAIL") if r.expected else ("info" if r.ok else "info: broken")
            body.append((r.check, r.output, r.component, _fmt(r.max_abs), _fmt(r.mean_abs), _fmt(r.max_rel), _fmt(r.mean_rel), _fmt(r.rtol), status))
        widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
        out = []
        if self.title:
            out.append(f"{self.title}" + (f" ({str(self.dtype).replace('torch.', '')})" if self.dtype else ""))
        out += [line(head), line(["-" * w for w in widths])] + [line(b) for b in body]
        out.append("overall: " + ("ok" if self.ok else f"FAIL ({len(self.failures())} rows)"))
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "dtype": str(self.dtype).replace("torch.", "") if self.dtype else None,
            "ok": self.ok,
            "meta": self.meta,
            "rows": [r.to_dict() for r in self.rows],
        }

    def to_json(self, **kw) -> str:
        def clean(v):
            return None if isinstance(v, float) and not math.isfinite(v) else v

        d = self.to_dict()
        d["rows"] = [{k: clean(v) for k, v in r.items()} for r in d["rows"]]
        return json.dumps(d, **kw)
