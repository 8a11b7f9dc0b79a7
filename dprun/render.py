"""Render explanations and reports as terminal tables or Markdown."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from dprun.ledger.entries import FINGERPRINT_PREFIX, PENDING, Status


def _num(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _accuracy(metric: dict[str, Any]) -> str:
    if "ci95_rank_error" in metric:
        return _quantile_accuracy(metric)
    if "ci95_half_width" in metric:
        return f"±{_num(metric['ci95_half_width'])}"
    sizes = metric["ci95_half_width_at_rows"]
    return ", ".join(f"±{_num(v)} at {int(k):,} rows" for k, v in sizes.items())


def _quantile_accuracy(metric: dict[str, Any]) -> str:
    """E.g. `candidates (the smaller predicted error; rank error ~3903; tree ~4653): rank ±8268 values; …`."""
    unit = f" {metric['unit']}" if metric.get("unit") else ""
    stds = metric["predicted_rank_error_by_method"]
    chosen = metric["quantile_method"]
    others = "".join(f"; {m} ~{_num(s)}" for m, s in stds.items() if m != chosen)
    values = ", ".join(f"±{_num(v)}{unit} at {int(k):,} privacy units"
                       for k, v in metric["ci95_value_error_if_even_at_units"].items())
    why = f"{metric['quantile_method_reason']}; " if metric.get("quantile_method_reason") else ""
    return (f"{chosen} ({why}rank error ~{_num(stds.get(chosen))}{others}): rank ±{_num(metric['ci95_rank_error'])} values; "
            f"{values} (values spread evenly, max_contributions_per_partition each)")


def _input_line(query: dict[str, Any]) -> str:
    """E.g. `input: visits, joined with public restaurants on restaurant_id (inner: rows without a match dropped)`;
    a join of private inputs also says how many rows per privacy unit each keeps."""
    bounds = query.get("max_rows_per_unit", {})

    def cut(name: str) -> str:
        return f" (at most {bounds[name]:,} row{'s' if bounds[name] > 1 else ''} per privacy unit)" if name in bounds \
            else ""

    joins = "".join(
        f", joined with {'public' if j.get('public', True) else 'private'} {j['input']}{cut(j['input'])} "
        f"on {', '.join(j['on'])} "
        f"({'inner: rows without a match dropped' if j['how'] == 'inner' else 'left: rows without a match kept'})"
        for j in query.get("joins", []))
    return f"input: {query['input']}{cut(query['input'])}{joins}"


def _postprocess_line(query: dict[str, Any]) -> str:
    """What a query written in SQL does to its released table, e.g. `after the noise: HAVING visits >
    1000, ORDER BY visits DESC, LIMIT 3 (post-processing, no budget)`."""
    post = query["postprocess"]
    steps = [f"HAVING {post['having']}"] if post["having"] else []
    if post["order_by"]:
        steps.append("ORDER BY " + ", ".join(f"{o['column']}{' DESC' if o['descending'] else ''}"
                                             for o in post["order_by"]))
    if post["limit"] is not None:
        steps.append(f"LIMIT {post['limit']}")
    return f"after the noise: {', '.join(steps)} (post-processing, no budget)"


def _selection_line(query: dict[str, Any]) -> str:
    p = query["partitions"]
    if p["mode"] == "global":
        return "one global partition (no group_by)"
    if p["mode"] == "public":
        return f"public partitions: {p['public_keys']} keys, each released (absent ones with noise only)"
    text = (
        f"private partitions by {p['selection']} (ε={_num(p['epsilon'])}, δ={_num(p['delta'])}); "
        f"a partition needs ~{p['units_for_50pct_keep']} privacy units for a 50% chance to be released, "
        f"{p['units_for_95pct_keep']} for 95%"
    )
    if p["selection"] == "weighted_gaussian_threshold":
        text += (" when each of its units is in max_partitions_contributed partitions; fewer when they are in fewer "
                 "(a unit in n partitions weighs 1/√n)")
    if p["threshold_on"]:
        text += f"; threshold {_num(p['threshold'])} on the released {p['threshold_on']}"
    if p["second_bounding"]:
        text += "; metrics computed after a second contribution bounding (Plume)"
    return text


def _auto_bounds_line(query: dict[str, Any]) -> str:
    auto = query["auto_bounds"]
    chosen = auto["chosen"]
    if chosen is None:
        parts = [f"{name} among {values[0]}…{values[-1]} (powers of 2)" for name, values in auto["candidates"].items()]
        parts += [f"{value['metric']}'s bounds among 0 and ±powers of 2" for value in auto["value_bounds"]]
        text = (f"auto bounds: {', '.join(parts)}, chosen from noisy histograms of the privacy units' "
                f"contributions and values (ε={_num(auto['epsilon'])}) for the least error of dropped rows, "
                "clipped values and noise")
        if auto["candidates"]:
            text += "; the accuracy above is for the largest contribution candidates, the most noise they can give"
        if auto["value_bounds"]:
            text += "; metrics with auto value bounds show their accuracy at bounds [0, 1]: it scales with the chosen bounds"
        return text
    parts = []
    if auto["candidates"]:
        parts.append(f"max_partitions_contributed {chosen['max_partitions_contributed']}, "
                     f"max_contributions_per_partition {chosen['max_contributions_per_partition']}; they drop an "
                     f"estimated {100 * chosen['dropped_share_estimate']:.1f}% of the rows")
    parts += [f"{metric} bounds [{_num(value['bounds'][0])}, {_num(value['bounds'][1])}], the "
              f"{_percentile(value['quantile_levels'][0])} and {_percentile(value['quantile_levels'][1])} "
              "percentiles of its column"
              for metric, value in chosen["value_bounds"].items()]
    return f"bounds chosen from the data (ε={_num(auto['epsilon'])}): " + "; ".join(parts)


def _percentile(level: float) -> str:
    return f"{100 * level:.3g}th"


def auto_bounds_warnings(query: dict[str, Any]) -> list[str]:
    """What a query's auto step could not see well, from its report entry (`report.auto_bounds_warnings`)."""
    auto = query.get("auto_bounds")
    chosen = auto["chosen"] if auto else None
    return list((chosen or {}).get("warnings", []))


def metric_rows(query: dict[str, Any]) -> list[list[str]]:
    return [
        [m["name"], m["kind"], m["noise"], _num(m["epsilon"]), _num(m["delta"]), _num(m["std"]), _accuracy(m)]
        for m in query["metrics"]
    ]


METRIC_HEADER = ["metric", "kind", "noise", "ε", "δ", "noise std", "95% interval"]


def print_explanation(explanation: dict[str, Any], console: Console) -> None:
    for query in explanation["queries"]:
        table = Table(title=f"query {query['name']}  (ε={_num(query['epsilon_share'])}, δ={_num(query['delta_share'])})",
                      title_justify="left")
        for column in METRIC_HEADER:
            table.add_column(column, overflow="fold")
        for row in metric_rows(query):
            table.add_row(*row)
        console.print(table)
        console.print("  " + _input_line(query))
        console.print("  " + _selection_line(query))
        if query.get("auto_bounds"):
            console.print("  " + _auto_bounds_line(query), markup=False)
            for warning in auto_bounds_warnings(query):
                console.print(f"  WARNING: {warning}", markup=False)
        if query.get("postprocess"):
            console.print("  " + _postprocess_line(query))
        console.print()
    console.print(_total_line(explanation))


def _total_line(explanation: dict[str, Any]) -> str:
    total, budget = explanation["total"], explanation["budget"]
    line = (
        f"total: ε={_num(total['epsilon'])}, δ={_num(total['delta'])} under {explanation['accounting']} accounting "
        f"(budget ε={_num(budget['epsilon'])}, δ={_num(budget['delta'])})"
    )
    if explanation["noise_multiplier"] < 1:
        line += f"; tight accounting cut every noise scale to {explanation['noise_multiplier']:.3f}× of basic"
    return line


def explanation_markdown(explanation: dict[str, Any], title: str = "Privacy budget") -> str:
    lines = [f"# {title}: {explanation['spec'] or 'dprun spec'}", ""]
    for query in explanation["queries"]:
        lines += [f"## Query `{query['name']}`", "", _input_line(query), "", _selection_line(query), ""]
        if query.get("auto_bounds"):
            lines += [_auto_bounds_line(query), ""]
            lines += [f"**WARNING: {warning}**\n" for warning in auto_bounds_warnings(query)]
        if query.get("postprocess"):
            lines += [_postprocess_line(query), ""]
        if "partitions_released" in query:
            lines += [f"Partitions released: **{query['partitions_released']}** → `{query['output']}`", ""]
        lines.append("| " + " | ".join(METRIC_HEADER) + " |")
        lines.append("|" + "---|" * len(METRIC_HEADER))
        lines += ["| " + " | ".join(row) + " |" for row in metric_rows(query)]
        lines.append("")
    lines.append(_total_line(explanation))
    if explanation.get("non_private_test_seed"):
        lines += ["", "**WARNING: made with a test seed; this release is NOT private.**"]
    return "\n".join(lines) + "\n"


def print_summary(report: dict[str, Any], console: Console) -> None:
    table = Table(title="released", title_justify="left")
    # Per query the standalone guarantees add up (basic composition); under pld the total below is tighter.
    epsilon = "ε (sum)" if report["accounting"] == "pld" else "ε"
    for column in ("query", "partitions released", epsilon, "δ", "output"):
        table.add_column(column, overflow="fold")
    for query in report["queries"]:
        eps = sum(m["epsilon"] for m in query["quantities"]) + query["partitions"]["epsilon"]
        eps += query["auto_bounds"]["epsilon"] if query.get("auto_bounds") else 0.0
        delta = sum(m["delta"] for m in query["quantities"]) + query["partitions"]["delta"]
        table.add_row(query["name"], str(query["partitions_released"]), _num(eps), _num(delta), query["output"])
    console.print(table)
    console.print(_total_line(report))
    for query in report["queries"]:
        for warning in auto_bounds_warnings(query):
            console.print(f"WARNING: query {query['name']}: {warning}", markup=False)
    if report.get("non_private_test_seed"):
        console.print("[bold red]WARNING: made with a test seed; this release is NOT private.[/]")


def ledger_status_lines(state: Status | None, lifetime_declared: bool) -> list[str]:
    """Plain-text lines for `explain-budget` (Markdown-safe)."""
    if state is None:
        lines = ["ledger: none configured; re-runs are not refused and no release is recorded"]
        if lifetime_declared:
            lines.append("warning: budget.lifetime is declared but cannot be enforced without a ledger; "
                         "`dprun run` will refuse to run")
        return lines
    release = state.release
    name = release.dataset if release.dataset_declared else f"{release.dataset[:30]}… (from the input files)"
    lines = [
        f"ledger: {state.ledger}",
        f"dataset {name}: spent {state.spent} in {state.releases} release(s)"
        + (f" ({state.pending} pending)" if state.pending else "") + f"; this spec costs {release.requested}",
    ]
    if release.lifetime is not None and state.remaining is not None:
        verdict = "fits" if state.fits else "does NOT fit: `dprun run` will refuse it (exit 4)"
        lines.append(f"lifetime {release.lifetime}: remaining {state.remaining}; this release {verdict}")
    else:
        lines.append("no lifetime budget declared (budget.lifetime): spending is recorded but not capped")
    if state.earlier is not None and state.earlier.get("state") == PENDING:
        lines.append(f"being released since {state.earlier['time']} (release {state.earlier['release']}, pending): "
                     "`dprun run` will refuse it (exit 5) unless --new-release")
    elif state.earlier is not None:
        lines.append(f"already released at {state.earlier['time']} (release {state.earlier.get('release')}): "
                     "`dprun run` will refuse it (exit 5) unless --new-release")
    return lines


def short_dataset(key: str) -> str:
    """A dataset id as tables show it: an id made of input fingerprints, cut short."""
    return key[:30] + "…" if key.startswith(FINGERPRINT_PREFIX) else key


PROFILE_ROWS = (("partitions per unit", "partitions_per_unit"),
                ("rows per unit", "rows_per_unit"),
                ("rows per unit and partition", "rows_per_unit_and_partition"),
                ("units per partition", "units_per_partition"))


def print_profile(found: dict[str, Any], console: Console) -> None:
    """`dprun profile`'s text output: per query, the binned percentiles and the bounds auto would choose."""
    for query in found["queries"]:
        partitions = query["partitions_estimate"]
        where = f"{partitions:,} partitions" if partitions else "partitions too few to count at this ε"
        table = Table(title=f"query {query['name']}  (ε={_num(query['epsilon'])}): about {query['units_estimate']:,} "
                      f"units in {where}", title_justify="left")
        for column in ("", "50%", "90%", "99%"):
            table.add_column(column, overflow="fold")
        shown = [(label, query[key]) for label, key in PROFILE_ROWS if query[key] is not None]
        for label, levels in shown:
            table.add_row(label, *(_stated(levels[level]) for level in ("p50", "p90", "p99")))
        console.print(table)
        unseen = [level["epsilon_needed"] for _, levels in shown for level in levels.values() if level.get("cannot_tell")]
        if unseen:
            console.print(f"  ? : cannot tell at this ε, its noise is too wide; --epsilon {_num(max(unseen))} would "
                          "tell them all", markup=False)
        for metric, found_values in query["values"].items():
            console.print("  " + _value_line(metric, found_values), markup=False)
        auto, spec = query["auto_would_choose"], query["spec_bounds"]
        if auto["max_partitions_contributed"] is None:
            console.print(f"  auto cannot recommend contribution bounds at this ε (its choice may be "
                          f"{100 * auto['shortfall']:.0f} points of relative error off the best); --epsilon "
                          f"{_num(auto['epsilon_needed'])} would; the spec says {spec['max_partitions_contributed']}"
                          f" and {spec['max_contributions_per_partition']}", markup=False)
        else:
            console.print(f"  auto would choose max_partitions_contributed {auto['max_partitions_contributed']}, "
                          f"max_contributions_per_partition {auto['max_contributions_per_partition']} (an estimated "
                          f"{100 * auto['dropped_share_estimate']:.1f}% of the rows dropped); the spec says "
                          f"{spec['max_partitions_contributed']} and {spec['max_contributions_per_partition']}",
                          markup=False)
        for metric, bounds in auto["value_bounds"].items():
            chosen = "cannot tell at this ε" if bounds is None else _bounds_text(bounds)
            console.print(f"  auto would choose {metric} bounds: {chosen}; the spec says "
                          f"{_bounds_text(spec['value_bounds'][metric])}", markup=False)
        console.print()
    line = f"spent: ε={_num(found['epsilon'])}, δ=0"
    if found.get("ledger"):
        line += f", recorded as release {found['ledger']['release']} in the ledger"
    console.print(line, markup=False)
    if found["non_private_test_seed"]:
        console.print("WARNING: made with a test seed; this profile is NOT private.", markup=False)


def _value_line(metric: str, found: dict[str, Any]) -> str:
    """A metric column's two DP percentiles (each unit's rows weighed as one unit), or why not."""
    if found.get("cannot_tell"):
        return (f"values of {metric}: cannot tell where they lie at this ε; --epsilon {_num(found['epsilon_needed'])} "
                "would")
    (low, lower), (high, upper) = [(k, v) for k, v in found.items() if k.startswith("p")]
    outside = float(low[1:]) + 100 - float(high[1:])
    return (f"values of {metric} (each unit's rows weighed as one): between {_num(lower)} and {_num(upper)} for all "
            f"but about {outside:.2g}% ({low} and {high}, each within ±{found['band']:.2g} percentile points)")


def _bounds_text(bounds: list[float] | str) -> str:
    return bounds if isinstance(bounds, str) else f"[{_num(bounds[0])}, {_num(bounds[1])}]"


def _stated(found: dict[str, Any]) -> str:
    """A binned percentile: `≤ 16 ±0.5` (its bin's upper end, its band in percentile points), `> 128`,
    or `?` where the noise is too wide to tell."""
    if found.get("cannot_tell"):
        return "?"
    value = found["at_most"]
    return f"{value if isinstance(value, str) else '≤ ' + _num(value)} (±{found['band']:.2g} pts)"


