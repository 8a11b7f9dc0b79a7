"""The release card (report.html): written by every run of every example spec, self-contained,
and checked in a real browser (headless Chromium: loaded, scripts ran without an error, every
chart drawn). `explain-budget --format html` gives the card before any data is read.

The browser tests need Debian's `chromium` (`.ci/run` installs it); they are skipped, with the
reason, where it is missing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from dprun_testing import everything, invoke_clean, no_ambient_ledger  # noqa: F401 (a fixture)

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


def example_copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "specs", tmp_path / "specs")
    (tmp_path / "sample_data").symlink_to(ROOT / "sample_data")
    return tmp_path


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
        assert f"<th>{column}</th>" in text
