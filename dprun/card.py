"""The release card: `report.html`, one self-contained page a person looks at.

Per release: the guarantee and how it was accounted, the budget split as a chart, and per
query its partitions (for a private selection, the chance that a partition is kept
against its number of privacy units), its contribution bounds, and per metric the
released values with their 95% intervals, as a chart of the largest partitions and a
sortable table of all. A value is shown to the precision its interval supports (two
significant digits of the column's smallest interval). Means, variances and quantiles
have an interval that depends on the partition's size: it is computed at the size the
query itself releases (its count of rows, else of privacy units), post-processing of
DP values. Before a run (`explain-budget --format html`) the same card without released
values.

Only DP outputs (the released tables) and public facts (the plan) go in, as in the
other reports. Charts are static SVG drawn by matplotlib and inlined, with one small
inline script that sorts the tables: the page fetches nothing, opens offline and prints
as it shows. matplotlib rather than a JavaScript charting library: its SVG needs no
runtime to vendor into the page (Vega-Lite's would add about a megabyte of script, or
a headless renderer), and it is the plotting library every Python data stack already has.
"""

from __future__ import annotations

import html
import io
import math
import warnings
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

if TYPE_CHECKING:
    import polars as pl
    from matplotlib.figure import Figure

    from dprun.mechanisms.selection import SelectionMechanism
    from dprun.plan import Plan, QueryPlan

# Partitions drawn per metric chart (the largest released values); the table has more.
CHART_PARTITIONS = 15
# Rows of a released table the card shows, the first in key order: a release of 10^6 partitions
# made a card of ~150 MB that browsers struggle to open, and took ~8 s of the run to render.
# The output file has every row.
CARD_ROWS = 10_000
# A metric chart's margins in inches (`_fit_margins`): beside the y tick labels on the left; the
# x tick labels and the x label below; half the last x tick label on the right. Tick labels
# that would take more than MOST_LEFT of the width are cut.
MARGINS = {"left": 0.12, "bottom": 0.55, "right": 0.3, "top": 0.1}
MOST_LEFT = 0.6
POINTS_PER_INCH = 72.0
# Points of a keep curve: enough for a smooth line at the chart's size.
KEEP_CURVE_POINTS = 64
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 60rem; color: #222; line-height: 1.4; }
h1 { margin-bottom: 0.2rem; } h2 { border-bottom: 1px solid #ccc; margin-top: 2.5rem; }
.facts { color: #555; } .warning { background: #fde2e1; border: 2px solid #c0392b; padding: 0.8rem; }
figure.chart { margin: 1rem 0; } figure.chart svg { width: 100%; height: auto; }
.note { background: #f6f6f6; border-left: 3px solid #999; padding: 0.4rem 0.8rem; font-size: 0.9rem; }
figcaption { color: #555; font-size: 0.9rem; }
table { border-collapse: collapse; font-size: 0.9rem; margin: 0.5rem 0 1rem; }
th, td { border: 1px solid #ddd; padding: 0.25rem 0.6rem; text-align: right; }
th { background: #f3f3f3; cursor: pointer; } th.key, td.key { text-align: left; }
@media print { th { cursor: auto; } h2 { break-before: auto; } figure.chart { break-inside: avoid; } }
"""
# Click a column's header to sort its table by it (numbers as numbers), again to reverse.
SCRIPT = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (header, column) {
    header.addEventListener("click", function () {
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      var down = header.dataset.order !== "down";
      rows.sort(function (a, b) {
        var x = a.cells[column].dataset.value, y = b.cells[column].dataset.value;
        var nx = parseFloat(x), ny = parseFloat(y);
        var order = (isNaN(nx) || isNaN(ny)) ? x.localeCompare(y) : nx - ny;
        return down ? -order : order;
      });
      header.dataset.order = down ? "down" : "up";
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
document.body.dataset.ready = "1";
"""


def release_card(plan: Plan, tables: dict[str, pl.DataFrame] | None = None,
                 release: dict[str, Any] | None = None, charts: Charts | None = None) -> str:
    """The card's HTML: of a release, with its tables by query name and `release` (its
    `release_id`, `released_on` and `non_private_test_seed`, as in report.json); before a
    run, of the plan alone. `charts` may hold the plan's charts drawn ahead.

    Drawn from the plan (`report.explain`) and the released tables only, so it can be drawn
    before publication starts and the all-or-nothing switch stays short.
    """
    from dprun.report import explain

    charts = Charts() if charts is None else charts

    report = {**explain(plan), **(release or {})}
    title = f"DP release: {report['spec'] or 'unnamed spec'}" if tables is not None else \
        f"DP release plan: {report['spec'] or 'unnamed spec'}"
    parts = [f"<h1>{_text(title)}</h1>", _facts(report, tables is not None)]
    if report.get("non_private_test_seed"):
        parts.append('<p class="warning"><strong>Not private:</strong> made with a test seed (--seed); the noise '
                     "is reproducible, so these numbers protect no one. Never publish them.</p>")
    parts.append("<h2>How the budget is spent</h2>")
    spent_on = [part for part, present in (
        ("choosing the auto bounds", any(q.get("auto_bounds") for q in report["queries"])),
        ("partition selection", any(q["partitions"]["mode"] == "private" and q["partitions"].get("epsilon")
                                    for q in report["queries"])),
        ("the noisy quantities each metric is computed from", True)) if present]
    caption = f"ε per query, split between {_listed(spent_on)}." if len(spent_on) > 1 else \
        "ε per query, split between the noisy quantities each metric is computed from."
    if report["accounting"] == "pld":
        caption += " Under pld accounting the release's total ε is less than the sum of these parts."
    parts.append(_figure("budget", charts.budget(report["queries"]), caption))
    for query, explained in zip(plan.queries, report["queries"], strict=True):
        table = None if tables is None else tables[query.name]
        parts.append(_query_section(query, explained, table, charts.keep(query)))
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{_text(title)}</title>\n'
            f"<style>{STYLE}</style>\n</head>\n<body>\n{body}\n<script>{SCRIPT}</script>\n</body>\n</html>\n")


def _facts(report: dict[str, Any], released: bool) -> str:
    total, budget = report["total"], report["budget"]
    lines = [(f"Guarantee: ({_num(total['epsilon'])}, {_num(total['delta'])})-differential privacy per privacy "
              f"unit, {report['accounting']} accounting (budget ε = {_num(budget['epsilon'])}, "
              f"δ = {_num(budget['delta'])}).")]
    if released:
        lines.append(f"Release {_text(str(report.get('release_id')))}, released on "
                     f"{_text(str(report.get('released_on')))}.")
    else:
        lines.append("Planned from the spec and the input schemas; no data row was read.")
    return "".join(f'<p class="facts">{line}</p>' for line in lines)


def _auto_bounds_text(auto: dict[str, Any] | None) -> str:
    """What the contribution bounds' sentence adds when some bound is `auto`, and one sentence on value bounds."""
    if auto is None:
        return ""
    text = ""
    if auto["candidates"] and auto["chosen"] is None:
        text += (f" (auto: chosen from the data with ε = {_num(auto['epsilon'])} before the query runs; the "
                 "accuracy below is for the largest candidates)")
    elif auto["candidates"]:
        text += f" (chosen from the data with ε = {_num(auto['epsilon'])})"
    metrics = ", ".join(_text(value["metric"]) for value in auto["value_bounds"])
    if metrics and auto["chosen"] is None:
        text += (f". The value bounds of {metrics} are chosen from the data with ε = {_num(auto['epsilon'])} "
                 "before the query runs; their accuracy below is at bounds [0, 1] and scales with them")
    elif metrics:
        chosen = ", ".join(f"{_text(metric)} [{_num(v['bounds'][0])}, {_num(v['bounds'][1])}]"
                           for metric, v in auto["chosen"]["value_bounds"].items())
        text += f". Value bounds chosen from the data with ε = {_num(auto['epsilon'])}: {chosen}"
    return text


Drawn = TypeVar("Drawn", str, str | None)


class Charts:
    """The charts that depend on the plan alone, each kept by what it shows: drawn ahead from
    a plan (`card_helper` does this while the run executes), then taken by `release_card`
    where its plan shows the same (a plan whose auto bounds were chosen since may not)."""

    def __init__(self) -> None:
        self._drawn: dict[Hashable, Any] = {}

    def draw_ahead(self, plan: Plan) -> None:
        from dprun.report import explain

        self.budget(explain(plan)["queries"])
        for query in plan.queries:
            self.keep(query)

    def budget(self, queries: list[dict[str, Any]]) -> str:
        """The budget chart of the explained queries."""
        rows = tuple((query["name"], tuple(_budget_segments(query))) for query in queries)
        return self._once(("budget", rows), lambda: _budget_chart(rows))

    def keep(self, query: QueryPlan) -> str | None:
        """The query's keep curve (None without private selection)."""
        selection = query.selection
        return self._once(("keep", selection.mode, selection.detail), lambda: _keep_chart(query))

    def _once(self, shown: Hashable, draw: Callable[[], Drawn]) -> Drawn:
        if shown not in self._drawn:
            self._drawn[shown] = draw()
        return self._drawn[shown]


def _query_section(query: QueryPlan, explained: dict[str, Any], table: pl.DataFrame | None, keep: str | None) -> str:
    partitions = explained["partitions"]
    bounds = explained["contribution_bounds"]
    parts = [f"<h2>Query {_text(query.name)}</h2>",
             (f"<p>Each privacy unit contributes to at most {bounds['max_partitions_contributed']} partition(s) "
              f"and at most {bounds['max_contributions_per_partition']} row(s) per partition"
              f"{_auto_bounds_text(explained['auto_bounds'])}.</p>"),
             f"<p>{_partitions_text(partitions, table)}</p>"]
    parts += [f'<p class="warning"><strong>The automatic bounds saw too little:</strong> {_text(warning)}.</p>'
              for warning in ((explained["auto_bounds"] or {}).get("chosen") or {}).get("warnings", [])]
    if keep is not None:
        counted = ("units, not rows, each in as many partitions as the bounds allow: the most a partition can need"
                   if query.selection.mechanism == "weighted_gaussian_threshold" else
                   "units, not rows: each unit counts once")
        parts.append(_figure(f"keep-{query.name}", keep, "Chance that a partition is released against its number "
                             f"of privacy units ({counted})."))
    if table is not None:
        keys = list(query.group_by)
        columns = {m.name: [c for c in m.output_columns if c in table.columns] for m in query.metrics}
        halves = _uncertainties(table, explained, columns)
        sized_by = _size_column(explained)
        for metric in explained["metrics"]:
            for column in columns[metric["name"]]:
                chart = _metric_chart(table, keys, column, halves.get(column))
                if chart is not None:
                    parts.append(_figure(f"metric-{query.name}-{column}", chart,
                                         _metric_caption(column, metric, sized_by)))
        parts.append(_table(table, keys, explained["metrics"], columns, halves, query.output_path.name))
        parts.append(_negative_note(table, explained["metrics"], columns))
    else:
        parts.append(_accuracy_table(explained["metrics"]))
    return "\n".join(parts)


def _partitions_text(partitions: dict[str, Any], table: pl.DataFrame | None) -> str:
    released = "" if table is None else f" {table.height} partition(s) released."
    if partitions["mode"] == "global":
        return "One partition: the whole input." + released
    if partitions["mode"] == "public":
        return f"Public partitions: the {partitions['public_keys']} listed keys, each released." + released
    text = f"Private partitions, chosen by {_text(str(partitions['selection']))}"
    if partitions.get("units_for_50pct_keep") is not None:
        text += (f": a partition with {partitions['units_for_50pct_keep']} privacy units is released with 50% "
                 f"chance, with {partitions['units_for_95pct_keep']} with 95%")
        if partitions["selection"] == "weighted_gaussian_threshold":
            text += (" when every unit is in as many partitions as the bounds allow; with fewer when they are in "
                     "fewer (a unit in n partitions weighs 1/√n)")
    return text + "." + released


def _metric_caption(column: str, metric: dict[str, Any], sized_by: tuple[str, str] | None) -> str:
    what = f"{_text(column)} ({_text(metric['kind'])})"
    half = metric.get("ci95_half_width")
    if half is not None:
        return f"{what}: the largest released values, with 95% intervals (± {_two_digits(half)})."
    if sized_by is None:
        return f"{what}: the largest released values. {_sizes_sentence(metric)}"
    name, kind = sized_by
    even = " if the values were spread evenly over the bounds" if "ci95_rank_error" in metric else ""
    return (f"{what}: the largest released values, with approximate 95% intervals at each partition's released "
            f"{kind} ({_text(name)}){even}.")


def _sizes_sentence(metric: dict[str, Any]) -> str:
    """How big a size-dependent interval is, for a query that releases no count to size it by."""
    if "ci95_rank_error" in metric:
        sizes = metric["ci95_value_error_if_even_at_units"]
        unit = "privacy units"
        after = ", if the values are spread evenly over the bounds"
    else:
        sizes = metric["ci95_half_width_at_rows"]
        unit, after = "rows", ""
    at = " and ".join(f"± {_two_digits(half)} at {int(size):,} {unit}" for size, half in sizes.items())
    return (f"The query releases no count to size its partitions by: the 95% interval is {at}{after}; add a "
            "<code>count</code> metric to see it per partition.")


def _two_digits(value: float) -> str:
    """A number with two significant digits, as intervals are shown."""
    places = _decimals(np.array([float(value)]))
    return _num(value) if places is None else _rounder(places)(value)


def _listed(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


# --- uncertainty ------------------------------------------------------------------------------------


def _size_column(explained: dict[str, Any]) -> tuple[str, str] | None:
    """The released column that sizes each partition, and what it counts: rows, else privacy units."""
    for kind, counts in (("count", "count of rows"), ("privacy_id_count", "count of privacy units")):
        for metric in explained["metrics"]:
            if metric["kind"] == kind and metric["column"] is None:
                return metric["name"], counts
    return None


def _uncertainties(table: pl.DataFrame, explained: dict[str, Any],
                   columns: dict[str, list[str]]) -> dict[str, np.ndarray]:
    """Each released column's 95% interval half-width per row (NaN where unknown): the noise's for
    counts and sums; for the other kinds at the partition's released size (`_size_column`), by the
    report's own formulas: a mean's, variance's or standard deviation's half-width is inversely
    proportional to the rows it is computed from (`report._ratio_std`), and a quantile's value error
    is its rank error over the values, if they were spread evenly over the bounds. A count of
    privacy units stands for at least as many rows, so sizing by it gives wider intervals."""
    sized_by = _size_column(explained)
    size = None if sized_by is None else np.maximum(
        np.nan_to_num(table[sized_by[0]].to_numpy().astype(np.float64), nan=1.0), 1.0)
    m = explained["contribution_bounds"]["max_contributions_per_partition"]
    by_units = sized_by is not None and sized_by[1].endswith("privacy units")
    out: dict[str, np.ndarray] = {}
    for metric in explained["metrics"]:
        half = _metric_half_widths(metric, size, by_units, m, table.height)
        out |= {column: half for column in columns[metric["name"]]}
    return out


def _metric_half_widths(metric: dict[str, Any], size: np.ndarray | None, by_units: bool, m: int,
                        rows: int) -> np.ndarray:
    if metric.get("ci95_half_width") is not None:
        return np.full(rows, float(metric["ci95_half_width"]))
    if size is None or metric.get("bounds") is None:
        return np.full(rows, np.nan)
    lower, upper = metric["bounds"]
    width = upper - lower
    if "ci95_rank_error" in metric:
        units = size if by_units else size / m
        return np.minimum(width, metric["ci95_rank_error"] / (np.maximum(units, 1.0) * m) * width +
                          metric["resolution"])
    at_100 = metric["ci95_half_width_at_rows"]["100"]
    most = {"mean": width, "stddev": width / 2, "variance": (width / 2) ** 2}.get(metric["kind"], math.inf)
    return np.minimum(at_100 * 100 / size, most)


def _decimals(halves: np.ndarray) -> int | None:
    """Decimals that show two significant digits of the column's smallest interval (negative: round
    to tens, hundreds, …); None when no row has one."""
    known = halves[np.isfinite(halves) & (halves > 0)]
    if known.size == 0:
        return None
    return 1 - math.floor(math.log10(float(known.min())))


def _rounder(decimals: int) -> Callable[[Any], str]:
    """A number rounded to these decimals, with thousands separators (anything else as `_num`
    shows it); the format made once, for a column's many values."""
    spec = f",.{max(decimals, 0)}f"

    def rounded(value: Any) -> str:
        # type(), not isinstance(): a bool is no number here.
        if type(value) in (int, float) and math.isfinite(value):
            return format(round(float(value), decimals), spec)
        return _num(value)
    return rounded


def _negative_note(table: pl.DataFrame, metrics: list[dict[str, Any]], columns: dict[str, list[str]]) -> str:
    """Why a count or sum can be negative, where one is, and the option that avoids it."""
    below = [m["name"] for m in metrics if m["kind"] in ("count", "privacy_id_count", "sum") and not m.get("clamp")
             and any((table[c] < 0).any() for c in columns[m["name"]])]
    if not below:
        return ""
    names = _listed([f"<code>{_text(name)}</code>" for name in below])
    return (f'<p class="note">Some values of {names} are below zero: the noise that protects each partition is '
            "added to its true value, and a small true value plus noise can be negative. They are kept so that "
            "sums and averages over partitions stay unbiased; <code>clamp: true</code> on a metric releases its "
            "values at zero or above instead (docs/spec.md, metrics).</p>")


# --- charts ------------------------------------------------------------------------------------


def _figure(name: str, svg: str, caption: str) -> str:
    return f'<figure class="chart" data-chart="{_text(name)}">{svg}<figcaption>{caption}</figcaption></figure>'


def _new_figure(height: float, constrained: bool = True) -> Figure:
    from matplotlib.figure import Figure

    # A Figure of its own, not pyplot: no global state, no GUI backend, safe in any thread.
    return Figure(figsize=(8.0, height), layout="constrained" if constrained else None)


def _fit_margins(figure: Figure, labels: list[str]) -> None:
    """A metric chart's margins: on the left its widest y tick label, measured from the font.

    Constrained layout finds them by drawing the chart an extra time, half of a card's
    drawing, which `dprun run` waits for (a card has a metric chart per released column).
    """
    from matplotlib import rcParams
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    font, measure = FontProperties(size=rcParams["ytick.labelsize"]), TextToPath()
    with warnings.catch_warnings():
        _ignore_missing_glyphs()
        widest = max((measure.get_text_width_height_descent(line, font, ismath=False)[0]
                      for label in labels for line in label.split("\n")), default=0.0)
    width, height = figure.get_size_inches()
    left = (widest + rcParams["ytick.major.size"] + rcParams["ytick.major.pad"]) / POINTS_PER_INCH + MARGINS["left"]
    figure.subplots_adjust(left=min(left / width, MOST_LEFT), right=1 - MARGINS["right"] / width,
                           bottom=MARGINS["bottom"] / height, top=1 - MARGINS["top"] / height)


def warm_up() -> None:
    """Import matplotlib and draw one small chart, loading its fonts, tickers and SVG backend
    (`card_helper` does this while it waits for a card to draw)."""
    figure = _new_figure(1.0)
    axes = figure.add_subplot()
    axes.barh(0, 1.0, label="a")
    axes.errorbar([1.0], [0], xerr=[0.5], fmt="o", capsize=3)
    axes.annotate("b", (1.0, 0), textcoords="offset points", xytext=(8, -12), fontsize=8)
    axes.set_yticks([0], ["c"])
    axes.set_xlabel("ε")
    figure.legend(loc="outside lower center", fontsize=8, frameon=False)
    _svg(figure)


def _svg(figure: Figure) -> str:
    import matplotlib

    buffer = io.StringIO()
    # No date, fixed element ids (matplotlib salts them with a random uuid by default), text
    # as paths: the same release draws the same bytes, and the page needs no font of its
    # own. A key with a character the bundled font lacks is drawn as a box in the chart
    # (the table beside it shows the text): not worth a warning.
    with warnings.catch_warnings(), matplotlib.rc_context({"svg.hashsalt": "dprun", "svg.fonttype": "path"}):
        _ignore_missing_glyphs()
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def _ignore_missing_glyphs() -> None:
    """Within `warnings.catch_warnings()`: no warning of a key's character the font lacks (a line
    break, measured alone, among them: (?s))."""
    warnings.filterwarnings("ignore", message="(?s)Glyph .* missing from font", category=UserWarning)


# Selection and the choice of auto bounds in greys; every noisy quantity its own colour, then
# hatches over the 20 colours once they run out, so that no two legend entries look alike.
SELECTION_COLOUR = "#999999"
AUTO_BOUNDS_COLOUR = "#cccccc"
HATCHES = ("", "//", "..", "xx", "\\\\")


# A part of a query's ε: its label, its ε and its fixed colour (None: the next one).
Segment = tuple[str, float, str | None]


def _budget_segments(query: dict[str, Any]) -> list[Segment]:
    """The query's parts of ε in order."""
    segments: list[Segment] = []
    if query.get("auto_bounds"):
        segments.append(("choosing the auto bounds", query["auto_bounds"]["epsilon"], AUTO_BOUNDS_COLOUR))
    partitions = query["partitions"]
    if partitions["mode"] == "private" and partitions.get("epsilon"):
        segments.append(("partition selection", partitions["epsilon"], SELECTION_COLOUR))
    for quantity in query["quantities"]:
        users = ", ".join(m["name"] for m in query["metrics"] if quantity["id"] in m["quantities"])
        segments.append((f"{users}: {quantity['description']}", quantity["epsilon"], None))
    return segments


def _budget_chart(rows: tuple[tuple[str, tuple[Segment, ...]], ...]) -> str:
    """A bar per query (its name, its segments) of its parts of ε."""
    from matplotlib import colormaps

    drawn = sum(len(segments) for _, segments in rows)
    figure = _new_figure(1.2 + 0.6 * len(rows) + 0.18 * drawn)
    axes = figure.add_subplot()
    tab20 = colormaps["tab20"]
    palette = [tab20(index) for index in range(tab20.N)]
    painted = 0
    for row, (name, segments) in enumerate(rows):
        left = 0.0
        for label, epsilon, fixed in segments:
            colour, hatch = (fixed, "") if fixed else \
                (palette[painted % len(palette)], HATCHES[painted // len(palette) % len(HATCHES)])
            painted += fixed is None
            axes.barh(row, epsilon, left=left, color=colour, hatch=hatch, edgecolor="white",
                      label=_plain(f"{name}: {label}"))
            left += epsilon
    axes.set_yticks(range(len(rows)), [_plain(name) for name, _ in rows])
    axes.invert_yaxis()
    axes.set_xlabel("ε")
    figure.legend(loc="outside lower center", ncols=1 if drawn <= 8 else 2, fontsize=8, frameon=False)
    return _svg(figure)


def _keep_chart(query: QueryPlan) -> str | None:
    """The keep curve of a query with private selection, else None."""
    detail = query.selection.detail
    if query.selection.mode != "private" or detail is None:
        return None
    return _keep_curve(detail)


def _keep_curve(detail: SelectionMechanism) -> str:
    from dprun.mechanisms.selection import keep_probability, units_to_keep

    half, most = units_to_keep(detail, 0.5), units_to_keep(detail, 0.95)
    units = np.unique(np.linspace(0, math.ceil(most * 1.3) + 1, KEEP_CURVE_POINTS).astype(np.int64))
    figure = _new_figure(2.6)
    axes = figure.add_subplot()
    axes.plot(units, keep_probability(detail, units), color="#4c78a8")
    for n, p in ((half, 0.5), (most, 0.95)):
        axes.plot([n], [p], "o", color="#e45756")
        axes.annotate(f"{p:.0%} at {n} units", (n, p), textcoords="offset points", xytext=(8, -12), fontsize=8)
    axes.set_xlabel("privacy units in the partition")
    axes.set_ylabel("chance it is released")
    axes.set_ylim(-0.02, 1.02)
    return _svg(figure)


def _metric_chart(table: pl.DataFrame, keys: list[str], name: str, halves: np.ndarray | None) -> str | None:
    values = table[name].to_numpy().astype(np.float64)
    finite = np.flatnonzero(np.isfinite(values))
    if finite.size == 0:
        return None
    order = finite[np.argsort(-values[finite], kind="stable")][:CHART_PARTITIONS]
    labels = [_key_label(table, keys, int(row)) for row in order]
    shown = None if halves is None else np.nan_to_num(halves[order], nan=0.0)
    return _errorbar_chart(values[order], labels, shown, _plain(name))


def _errorbar_chart(values: np.ndarray, labels: list[str], halves: np.ndarray | None, xlabel: str) -> str:
    """A dot per value, top to bottom, with its error bar (half-widths `halves`) and its label."""
    figure = _new_figure(1.0 + 0.28 * len(values), constrained=False)
    _fit_margins(figure, labels)
    axes = figure.add_subplot()
    axes.errorbar(values, range(len(values)), xerr=halves, fmt="o", color="#4c78a8", ecolor="#7f7f7f", capsize=3)
    axes.set_yticks(range(len(values)), labels)
    axes.invert_yaxis()
    axes.set_xlabel(xlabel)
    return _svg(figure)


def _key_label(table: pl.DataFrame, keys: list[str], row: int) -> str:
    if not keys:
        return "all"
    return _plain(" · ".join(str(table[key][row]) for key in keys))


def _plain(text: str) -> str:
    """Text matplotlib draws as written: a `$` would start its math mode (`$\\x{a}$` fails to parse)."""
    return text.replace("$", r"\$")


# --- tables ------------------------------------------------------------------------------------


def _table(table: pl.DataFrame, keys: list[str], metrics: list[dict[str, Any]],
           metric_columns: dict[str, list[str]], halves: dict[str, np.ndarray], output_name: str) -> str:
    """The released rows, the first CARD_ROWS of them in the table's own (key) order where there are
    more; `metric_columns` is each metric's output columns (a column per level of a multi-level
    quantile), `halves` their intervals per row. Values are shown to the precision of the column's
    smallest interval (over every released row), the whole value kept for sorting."""
    columns = [*keys, *(c for m in metrics for c in metric_columns[m["name"]])]
    decimals = {c: _decimals(halves[c]) for c in columns if c in halves}
    header = "".join(f'<th class="key">{_text(c)}</th>' if c in keys else
                     f"<th>{_text(c)}{' (± 95%)' if decimals.get(c) is not None else ''}</th>" for c in columns)
    shown = table.head(CARD_ROWS)
    cells = [_cells(shown[c], c in keys, decimals.get(c), None if c not in halves else halves[c][:CARD_ROWS])
             for c in columns]
    rows = [f"<tr>{''.join(row)}</tr>" for row in zip(*cells, strict=True)]
    cut = "" if shown.height == table.height else (
        f"The first {shown.height:,} of the {table.height:,} released rows, in key order; every row is in "
        f"{_text(output_name)}. ")
    return (f'<table class="sortable"><thead><tr>{header}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
            f"<p class=\"facts\">{cut}Click a column's header to sort by it. Values are rounded to the precision "
            "their intervals support.</p>")


def _cells(column: pl.Series, key: bool, places: int | None, halves: np.ndarray | None) -> list[str]:
    """A column's cells, a column at a time (a released table can have 10^5 rows): each shows its
    value (a metric's rounded to `places`, with its 95% interval) and keeps it whole to sort by."""
    values = column.to_list()
    # A number's text has nothing to escape.
    whole = [str(value) for value in values] if column.dtype.is_numeric() else \
        [_text(str(value)) for value in values]
    if key:
        return [f'<td class="key" data-value="{text}">{text}</td>' for text in whole]
    if places is None or halves is None:
        shown = [_num(value) for value in values]
    else:
        rounded = _once_per_value(_rounder(places))
        interval = _once_per_value(lambda half: f" ± {rounded(half)}" if math.isfinite(half) else "")
        shown = [_num(value) if value is None else rounded(value) + interval(half)
                 for value, half in zip(values, halves.tolist(), strict=True)]
    return [f'<td data-value="{text}">{cell}</td>' for text, cell in zip(whole, shown, strict=True)]


def _once_per_value(text: Callable[[Any], str]) -> Callable[[Any], str]:
    """`text`, worked out once per distinct value: a released column repeats many (noisy counts
    near the threshold, one interval on every row), and rounding each one took most of the
    card of a release of 10^5 partitions, which `dprun run` waits for. Keyed by the value's
    repr but for an int: 0.0 and -0.0 are equal, and shown apart."""
    shown: dict[Any, str] = {}

    def once(value: Any) -> str:
        key = value if type(value) is int else repr(value)
        found = shown.get(key)
        if found is None:
            found = shown[key] = text(value)
        return found
    return once


def _accuracy_table(metrics: list[dict[str, Any]]) -> str:
    rows = []
    for metric in metrics:
        half = metric.get("ci95_half_width")
        accuracy = "depends on each partition's size" if half is None else f"± {_num(half)}"
        rows.append(f'<tr><td class="key" data-value="{_text(metric["name"])}">{_text(metric["name"])}</td>'
                    f'<td class="key" data-value="{_text(metric["kind"])}">{_text(metric["kind"])}</td>'
                    f'<td data-value="{metric["epsilon"]}">{_num(metric["epsilon"])}</td>'
                    f'<td data-value="{half if half is not None else ""}">{accuracy}</td></tr>')
    return ('<table class="sortable"><thead><tr><th class="key">metric</th><th class="key">kind</th><th>ε</th>'
            f'<th>95% interval</th></tr></thead><tbody>{"".join(rows)}</tbody></table>')


def _num(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _text(value: str) -> str:
    return html.escape(value, quote=True)
