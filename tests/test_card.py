"""The release card (report.html): written by every run of every example spec, self-contained,
and checked in a real browser (headless Chromium: loaded, scripts ran without an error, every
chart drawn). `explain-budget --format html` gives the card before any data is read.

The browser tests need Debian's `chromium` (`.ci/run` installs it); they are skipped, with the
reason, where it is missing.
"""

from __future__ import annotations

import html
import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from dprun_testing import everything, example_copy, invoke_clean, no_ambient_ledger  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "specs").glob("*.yaml"))
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]

pytestmark = pytest.mark.usefixtures("no_ambient_ledger")


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("no headless Chromium here (Debian package `chromium`; .ci/run installs it)")
    return found


def released_card(tmp_path: Path, spec: Path, *extra: str) -> Path:
    folder = example_copy(tmp_path)
    result = invoke_clean("run", str(folder / "specs" / spec.name), "--overwrite", *extra)
    assert result.exit_code == 0, everything(result)
    [card] = list((folder / "out").rglob("report.html"))
    return card


def in_browser(card: Path, tmp_path: Path) -> tuple[str, str, Path]:
    """The page's DOM after its scripts ran, what Chromium logged, and a screenshot."""
    browser = chromium()
    common = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium'}", "--enable-logging=stderr",
              "--v=0", "--virtual-time-budget=5000"]
    dom = subprocess.run([*common, "--dump-dom", card.resolve().as_uri()], capture_output=True, text=True,
                         timeout=120, check=True)
    shot = tmp_path / "card.png"
    subprocess.run([*common, "--window-size=1280,2000", f"--screenshot={shot}", card.resolve().as_uri()],
                   capture_output=True, text=True, timeout=120, check=True)
    return dom.stdout, dom.stderr, shot


def console_errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if "CONSOLE" in line or "Uncaught" in line]


def charts(dom: str) -> list[str]:
    return re.findall(r'<figure class="chart" data-chart="([^"]+)">(.*?)</figure>', dom, re.DOTALL)


@pytest.mark.parametrize("spec", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_s_card_opens_offline_with_every_chart_drawn(spec: Path, tmp_path: Path) -> None:
    card = released_card(tmp_path, spec, "--seed", "5")
    text = card.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text), "the card fetches something"
    assert "<link" not in text and "@import" not in text
    dom, log, shot = in_browser(card, tmp_path)
    assert 'data-ready="1"' in dom, "the card's script did not run to its end"
    assert not console_errors(log), console_errors(log)
    drawn = charts(dom)
    assert drawn and any(name == "budget" for name, _ in drawn), [name for name, _ in drawn]
    for name, figure in drawn:
        assert "<svg" in figure and len(re.findall(r"<path", figure)) > 3, f"chart {name} is empty"
    assert shot.stat().st_size > 20_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_card_shows_the_release_and_warns_of_a_test_seed(tmp_path: Path) -> None:
    card = released_card(tmp_path, ROOT / "specs" / "restaurants_private.yaml", "--seed", "5")
    text = card.read_text()
    assert "Not private" in text and "test seed" in text
    assert 'data-chart="keep-' in text, "a private selection has its keep curve"
    released = sorted((card.parent).glob("*.csv"))
    assert released and "table class=\"sortable\"" in text
    report = (card.parent / "report.json").read_text()
    assert re.search(r'"release_id": "([0-9a-f]+)"', report).group(1) in text


def test_a_private_release_s_card_has_no_test_seed_warning(tmp_path: Path) -> None:
    card = released_card(tmp_path, ROOT / "specs" / "restaurants_public.yaml")
    assert "Not private" not in card.read_text()


def test_explain_budget_prints_the_card_before_any_data_is_read(tmp_path: Path) -> None:
    folder = example_copy(tmp_path)
    result = invoke_clean("explain-budget", str(folder / "specs" / "restaurants_private.yaml"), "--format", "html")
    assert result.exit_code == 0, everything(result)
    page = result.stdout
    assert page.startswith("<!DOCTYPE html>") and "no data row was read" in page
    assert 'data-chart="budget"' in page and 'data-chart="keep-' in page
    assert 'data-chart="metric-' not in page, "a card before the run shows no released value"
    assert not (folder / "out").exists()
    card = tmp_path / "plan.html"
    card.write_text(page)
    dom, log, _ = in_browser(card, tmp_path)
    assert 'data-ready="1"' in dom and not console_errors(log)


def test_the_same_release_draws_the_same_card(tmp_path: Path) -> None:
    """No random element ids or dates: the card is a function of the plan, the tables and the release."""
    from dprun import api
    from dprun.card import release_card

    folder = example_copy(tmp_path)
    validated = api.validate(folder / "specs" / "restaurants_private.yaml")
    plan = api.plan(validated)
    result = api.run(folder / "specs" / "restaurants_private.yaml", seed=7)
    release = {"release_id": "0" * 16, "released_on": "2026-01-01", "non_private_test_seed": True}
    assert release_card(plan, result.tables, release) == release_card(plan, result.tables, release)


def test_every_level_of_a_quantile_metric_is_charted_and_tabled(tmp_path: Path) -> None:
    folder = example_copy(tmp_path)
    spec = folder / "specs" / "quantiles.yaml"
    spec.write_text((folder / "specs" / "restaurants_public.yaml").read_text().replace(
        "      - {name: visits, kind: count}\n",
        "      - {name: visits, kind: count}\n"
        "      - {name: spend_q, kind: quantile, column: spend_eur, bounds: [0, 60], q: [0.1, 0.9]}\n"))
    result = invoke_clean("run", str(spec), "--overwrite", "--seed", "3")
    assert result.exit_code == 0, everything(result)
    text = (folder / "out" / "public" / "report.html").read_text()
    for column in ("spend_q_p10", "spend_q_p90"):
        assert f'data-chart="metric-visits_per_restaurant-{column}"' in text
        assert f"<th>{column} (± 95%)</th>" in text  # at each partition's released count


def cells(text: str, column: int) -> list[str]:
    """The shown text of one column of the card's table of released rows."""
    body = text[text.index("<tbody>"):text.index("</tbody>")]
    return [re.findall(r"<td[^>]*>([^<]*)</td>", row)[column] for row in re.findall(r"<tr>(.*?)</tr>", body)]


def test_values_are_rounded_to_the_precision_of_their_intervals(tmp_path: Path) -> None:
    """restaurants_public: visits ± 720, spend ± ~22,000, avg_spend at each partition's released visits."""
    text = released_card(tmp_path, ROOT / "specs" / "restaurants_public.yaml", "--seed", "5").read_text()
    header = re.findall(r"<th[^>]*>([^<]*)</th>", text[text.index("<thead>"):text.index("</thead>")])
    assert header == ["restaurant_id", "visits (± 95%)", "spend (± 95%)", "avg_spend (± 95%)"], header
    spend = cells(text, 2)
    assert all(re.fullmatch(r"-?[\d,]*000 ± 2\d,000", cell) for cell in spend), spend  # no digit below the noise
    means = cells(text, 3)
    decimals = {len(cell.split(" ± ")[0].partition(".")[2]) for cell in means}
    assert len(decimals) == 1 and all(" ± " in cell for cell in means), means  # one precision per column
    assert "± 21569.3" not in text and "(± 22,000)" in text


def test_a_long_table_shows_its_first_rows_in_key_order_and_says_where_the_rest_are(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond CARD_ROWS rows the card shows the first ones, as the output file orders them, and says so."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "cut").mkdir()
    plain = released_card(tmp_path / "plain", ROOT / "specs" / "restaurants_public.yaml", "--seed", "5").read_text()
    assert "released rows, in key order" not in plain and len(cells(plain, 0)) == 14
    from dprun import card  # noqa: PLC0415 - as the other tests of the card's module do

    monkeypatch.setattr(card, "CARD_ROWS", 5)
    text = released_card(tmp_path / "cut", ROOT / "specs" / "restaurants_public.yaml", "--seed", "5").read_text()
    output = tmp_path / "cut" / "out" / "public" / "visits_per_restaurant.parquet"
    released = pl.read_parquet(output)
    assert cells(text, 0) == released["restaurant_id"].head(5).to_list() == cells(plain, 0)[:5]
    assert cells(text, 1) == cells(plain, 1)[:5]  # rounded as on the whole table
    assert f"The first 5 of the 14 released rows, in key order; every row is in {output.name}." in text


def test_negative_counts_are_explained_and_clamp_is_pointed_to(tmp_path: Path) -> None:
    from dprun.card import _negative_note

    table = pl.DataFrame({"k": ["a", "b"], "n": [-3, 40], "s": [5.0, 1.0]})
    metrics = [{"name": "n", "kind": "count", "clamp": False}, {"name": "s", "kind": "sum", "clamp": False}]
    note = _negative_note(table, metrics, {"n": ["n"], "s": ["s"]})
    assert "Some values of <code>n</code> are below zero" in note and "<code>clamp: true</code>" in note
    assert _negative_note(table, [{**metrics[0], "clamp": True}, metrics[1]], {"n": ["n"], "s": ["s"]}) == ""


def test_a_mean_without_a_released_count_says_how_big_its_interval_is(tmp_path: Path) -> None:
    folder = example_copy(tmp_path)
    spec = folder / "specs" / "restaurants_public.yaml"
    spec.write_text(spec.read_text().replace("      - {name: visits, kind: count}\n", ""))
    result = invoke_clean("run", str(spec), "--overwrite", "--seed", "3")
    assert result.exit_code == 0, everything(result)
    text = (folder / "out" / "public" / "report.html").read_text()
    assert "avg_spend (mean): the largest released values. The query releases no count to size its partitions " \
        "by: the 95% interval is ± " in text
    assert "at 100 rows and ± " in text and "add a <code>count</code> metric to see it per partition" in text
    assert re.search(r"interval is ± [\d,.]+ at 100 rows and ± [\d,.]+ at 10,000 rows", text), text


def test_the_budget_chart_names_every_part_in_words_and_the_auto_bounds_choice(tmp_path: Path) -> None:
    from dprun.card import _budget_segments

    folder = example_copy(tmp_path)
    spec = folder / "specs" / "restaurants_public.yaml"
    spec.write_text(spec.read_text().replace("max_partitions_contributed: 3", "max_partitions_contributed: auto"))
    page = invoke_clean("explain-budget", str(spec), "--format", "html").stdout
    assert "split between choosing the auto bounds and the noisy quantities" in page
    assert "partition selection" not in page.split("How the budget is spent")[1].split("<h2>")[0]
    from dprun import api

    explained = api.explain(api.validate(spec))
    labels = [label for label, _, _ in _budget_segments(explained["queries"][0])]
    assert labels == ["choosing the auto bounds", "visits: rows counted", "spend: sum of spend_eur",
                      "avg_spend: values of spend_eur counted", "avg_spend: sum of spend_eur"], labels
    assert not any("(" in label for label in labels)


def test_a_key_matplotlib_would_read_as_math_is_drawn_as_text(tmp_path: Path) -> None:
    """One contributed row with such a key made every release of the spec fail after all the work."""
    from dprun.card import _plain

    for key in ("$\\nosuchcmd{a}$", "$5-$10", "a$b"):
        data = pl.DataFrame({"uid": [f"u{i}" for i in range(60)], "k": [key] * 30 + ["plain"] * 30})
        data.write_csv(tmp_path / "d.csv")
        spec = tmp_path / "spec.yaml"
        spec.write_text(json.dumps({
            "version": 1, "privacy_unit": "uid", "budget": {"epsilon": 1.0},
            "inputs": {"d": {"path": "d.csv"}},
            "queries": [{"name": "q", "input": "d", "group_by": ["k"], "partitions": {"public": [key, "plain"]},
                         "contribution_bounds": {"max_partitions_contributed": 1, "max_contributions_per_partition": 1},
                         "metrics": [{"name": "n", "kind": "count"}], "output": {"path": "out/q.csv"}}],
            "report": "out/report.json"}))
        result = invoke_clean("run", str(spec), "--overwrite", "--seed", "1")
        assert result.exit_code == 0, f"{key}: {everything(result)}"
        assert html.escape(key) in (tmp_path / "out" / "report.html").read_text()
        assert _plain(key).count("$") == _plain(key).count("\\$")


INTERNAL_NAME = re.compile(r"\b(quantile_tree|quantile_candidates|centered_sum|centered_sumsq|rows|privacy_units|sum)\(")


@pytest.mark.parametrize("spec", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_no_internal_quantity_name_reaches_a_reader(spec: Path, tmp_path: Path) -> None:
    """explain-budget's text, report.md and the card name a quantity by its metric, in words."""
    folder = example_copy(tmp_path)
    copy = folder / "specs" / spec.name
    explained = invoke_clean("explain-budget", str(copy))
    assert explained.exit_code == 0 and not INTERNAL_NAME.search(explained.stdout), explained.stdout
    card = released_card(tmp_path / "run", spec, "--seed", "5")
    for page in (card, card.with_suffix(".md")):
        found = INTERNAL_NAME.search(page.read_text())
        assert found is None, f"{page.name}: {found.group(0) if found else ''}"


def test_a_metric_chart_s_left_margin_fits_its_widest_line_of_any_key() -> None:
    # Keys are data: line breaks, tabs, characters the font lacks. The margin is measured per
    # line (a two-line key is drawn as two lines), and no glyph warning escapes (a run treats
    # one as an internal error).
    import warnings

    from matplotlib.figure import Figure

    from dprun import card

    def left(labels: list[str]) -> float:
        figure = Figure(figsize=(8.0, 2.0))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            card._fit_margins(figure, labels)
        return float(figure.subplotpars.left)

    assert left(["abcd\nab"]) == left(["abcd"]) > left(["ab\nab"])
    assert left(["日本\n\t", "\x00"]) > 0
    assert left(["W" * 500]) == card.MOST_LEFT


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.sampled_from([0.0, -0.0, 1.25, -1.25, 1234.5, math.nan, math.inf]),
                                 st.floats(-1e6, 1e6)), max_size=30),
       halves=st.lists(st.sampled_from([0.0, -0.0, 0.5, 12.0, math.inf, math.nan]), min_size=30, max_size=30),
       places=st.integers(-2, 3))
def test_a_column_s_cells_show_each_value_as_its_own_rounding_does(values: list[float | None], halves: list[float],
                                                                   places: int) -> None:
    # Cells are worked out once per distinct value: equal values that show apart (0.0 and
    # -0.0) must not share a text, nor a value share its interval's.
    from dprun import card

    halves = halves[:len(values)]
    rounded = card._rounder(places)
    expected = [f'<td data-value="{value}">' + ("" if value is None else rounded(value) + (
        f" ± {rounded(half)}" if math.isfinite(half) else "")) + "</td>" for value, half in zip(values, halves)]
    column = pl.Series(values, dtype=pl.Float64)
    assert card._cells(column, False, places, np.array(halves, dtype=np.float64)) == expected


def test_an_integer_column_s_cells_are_rounded_per_value() -> None:
    from dprun import card

    column = pl.Series([125, 135, 125, -5, 0, 135], dtype=pl.Int64)
    assert card._cells(column, False, -1, np.full(6, 34.0)) == [
        '<td data-value="125">120 ± 30</td>', '<td data-value="135">140 ± 30</td>',
        '<td data-value="125">120 ± 30</td>', '<td data-value="-5">-0 ± 30</td>',
        '<td data-value="0">0 ± 30</td>', '<td data-value="135">140 ± 30</td>']
