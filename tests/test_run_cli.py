"""`dprun run` end to end through the command line: all-or-nothing publication, overwriting,
the report, JSON output, exit codes and messages.

Every test generates its data with numpy into tmp_path and runs the CLI in-process through
its entry point `dprun.cli.main` (which turns errors into exit codes: 0 ok, 1 spec invalid,
2 usage/internal, 3 data, 6 output/IO, 130 interrupted). The seed of each test comes from
os.urandom and appears in every assertion message.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import signal
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from click.testing import Result
from dprun_testing import everything, fresh_seed, invoke

REPO = Path(__file__).resolve().parents[1]

from dprun import api, publish, render
from dprun.report import file_fingerprint

# --- helpers -------------------------------------------------------------------------------


def no_traceback(result: Result, seed: int | None = None) -> None:
    text = everything(result)
    assert "Traceback" not in text and 'File "' not in text, f"seed={seed}: traceback in output:\n{text}"
    assert result.exception is None or isinstance(result.exception, SystemExit), f"seed={seed}: {result.exception!r}"


def run(spec: Path, seed: int, *extra: str) -> Result:
    result = invoke("run", str(spec), "--seed", str(seed), *extra)
    no_traceback(result, seed)
    return result


def run_ok(spec: Path, seed: int, *extra: str) -> Result:
    result = run(spec, seed, *extra)
    assert result.exit_code == 0, f"seed={seed}: exit {result.exit_code}: {everything(result)}"
    return result


def query(name: str, input_name: str, output: str, metrics: list[dict[str, Any]], *, group_by: list[str] | None = None,
          partitions: dict[str, Any] | None = None, l0: int = 1, m: int = 1, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "input": input_name,
        "contribution_bounds": {"max_partitions_contributed": l0, "max_contributions_per_partition": m},
        "metrics": metrics,
        "output": {"path": output},
        **extra,
    }
    if group_by:
        body["group_by"] = group_by
    if partitions is not None:
        body["partitions"] = partitions
    return body


def write_spec(folder: Path, inputs: dict[str, str], queries: list[dict[str, Any]], *, epsilon: float = 1.0,
               delta: float = 1e-6, accounting: str = "basic", report: str = "out/report.json") -> Path:
    spec = {
        "version": 1,
        "name": "cli-test",
        "privacy_unit": "uid",
        "budget": {"epsilon": epsilon, "delta": delta, "accounting": accounting},
        "inputs": {name: {"path": path} for name, path in inputs.items()},
        "queries": queries,
        "report": report,
    }
    path = folder / "spec.yaml"
    path.write_text(json.dumps(spec, indent=2))
    return path


def visits(rng: np.random.Generator, rows: int = 4000, shops: int = 8) -> pl.DataFrame:
    return pl.DataFrame({
        "uid": rng.integers(0, rows // 4, rows),
        "shop": [f"s{k}" for k in rng.integers(0, shops, rows)],
        "day": [f"d{k}" for k in rng.integers(0, 7, rows)],
        "spend": rng.uniform(0, 50, rows).round(2),
    })


SHOPS = [f"s{k}" for k in range(8)]
COUNT_AND_SUM = [{"name": "visits", "kind": "count"},
                 {"name": "spend", "kind": "sum", "column": "spend", "bounds": [0, 50]}]


def files_under(folder: Path) -> dict[str, bytes]:
    """Every file a reader finds below `folder` (hidden ones included, links followed) with its bytes;
    dprun's release store `.dprun` is left out: `no_temporary_files` checks it."""
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and publish.STORE not in p.relative_to(folder).parts}


def digest(files: dict[str, bytes]) -> dict[str, str]:
    return {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}


def no_temporary_files(folder: Path, seed: int) -> None:
    leftovers = [str(p) for p in folder.rglob("*") if p.name.endswith(".tmp") or ".dprun-" in p.name]
    assert not leftovers, f"seed={seed}: temporary files left behind: {leftovers}"
    for store in folder.rglob(f"{publish.STORE}/*"):
        folder_of_releases = store / publish.RELEASES
        releases = sorted(p.name for p in folder_of_releases.iterdir()) if folder_of_releases.is_dir() else []
        current = [(store / publish.CURRENT).resolve().name] if (store / publish.CURRENT).exists() else []
        assert releases == current, f"seed={seed}: {store} holds {releases}, {current} is published"


def two_query_spec(folder: Path, rng: np.random.Generator, second_input: str) -> Path:
    """q1 reads a good Parquet file; q2 reads `second_input`, a CSV written by the caller."""
    visits(rng).write_parquet(folder / "good.parquet")
    return write_spec(folder, {"good": "good.parquet", "second": second_input}, [
        query("q1", "good", "out/q1.parquet", COUNT_AND_SUM, group_by=["shop"], partitions={"public": SHOPS}),
        query("q2", "second", "out/q2.csv", COUNT_AND_SUM, group_by=["shop"], partitions={"public": SHOPS}),
    ])


def write_csv_with_a_late_bad_value(path: Path, rng: np.random.Generator, bad: str | None) -> None:
    """A CSV whose `spend` column is numeric in the first 3,000 rows (more than the 1,000 rows that
    schema inference samples) and, if `bad` is given, holds that text at row 4,500."""
    frame = visits(rng, rows=6000).with_columns(pl.col("spend").cast(pl.String))
    if bad is not None:
        frame = frame.with_columns(
            spend=pl.when(pl.int_range(pl.len()) == 4500).then(pl.lit(bad)).otherwise(pl.col("spend"))
        )
    frame.write_csv(path)


# --- all or nothing -----------------------------------------------------------------------


def test_a_later_query_failing_on_its_data_publishes_nothing(tmp_path: Path) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    secret = "SECRET-VALUE-7QX"
    write_csv_with_a_late_bad_value(tmp_path / "late.csv", rng, bad=secret)
    spec = two_query_spec(tmp_path, rng, "late.csv")
    assert invoke("validate", str(spec)).exit_code == 0, "the bad value must be invisible to validation"

    result = run(spec, seed)
    assert result.exit_code == 3, f"seed={seed}: exit {result.exit_code}: {everything(result)}"
    assert "error" in result.stderr.lower(), f"seed={seed}: {everything(result)}"
    assert secret not in everything(result), f"seed={seed}: the message quotes a data value"
    assert files_under(tmp_path / "out") == {}, f"seed={seed}: published {list(files_under(tmp_path / 'out'))}"
    no_temporary_files(tmp_path, seed)

    result = run(spec, seed, "--format", "json")
    assert result.exit_code == 3, f"seed={seed}: exit {result.exit_code}: {everything(result)}"
    answer = json.loads(result.stdout)
    assert answer["ok"] is False and answer["exit_code"] == 3 and answer["problems"], f"seed={seed}: {answer}"
    assert secret not in everything(result), f"seed={seed}: the message quotes a data value"
    assert files_under(tmp_path / "out") == {}, f"seed={seed}"


def test_a_failed_run_leaves_existing_outputs_byte_identical_even_with_overwrite(tmp_path: Path) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    write_csv_with_a_late_bad_value(tmp_path / "late.csv", rng, bad=None)
    spec = two_query_spec(tmp_path, rng, "late.csv")
    run_ok(spec, seed)
    before = digest(files_under(tmp_path / "out"))
    assert set(before) == {"q1.parquet", "q2.csv", "report.json", "report.md", "report.html"}, before

    write_csv_with_a_late_bad_value(tmp_path / "late.csv", rng, bad="not-a-number")
    result = run(spec, seed + 1, "--overwrite")
    assert result.exit_code == 3, f"seed={seed}: exit {result.exit_code}: {everything(result)}"
    assert digest(files_under(tmp_path / "out")) == before, f"seed={seed}: existing outputs changed"
    no_temporary_files(tmp_path, seed)


def blocked_second_output(tmp_path: Path, seed: int) -> tuple[Path, dict[str, str]]:
    """A spec whose q2 output folder is a regular file, after a good run left outputs behind."""
    rng = np.random.default_rng(seed)
    visits(rng).write_parquet(tmp_path / "good.parquet")

    def spec_with_second_output(path: str) -> Path:
        return write_spec(tmp_path, {"good": "good.parquet"}, [
            query("q1", "good", "out/q1.parquet", COUNT_AND_SUM, group_by=["shop"], partitions={"public": SHOPS}),
            query("q2", "good", path, COUNT_AND_SUM, group_by=["day"],
                  partitions={"public": [f"d{k}" for k in range(7)]}),
        ])

    run_ok(spec_with_second_output("out/q2.parquet"), seed)
    (tmp_path / "out" / "q2.parquet").unlink()
    (tmp_path / "out" / "blocked").write_text("a file where q2's folder should be\n")
    # q1's file is staged first; creating q2's folder then fails because a file is in the way.
    return spec_with_second_output("out/blocked/q2.parquet"), digest(files_under(tmp_path / "out"))


def test_a_later_output_that_cannot_be_written_publishes_nothing(tmp_path: Path) -> None:
    seed = fresh_seed()
    spec, before = blocked_second_output(tmp_path, seed)
    result = run(spec, seed + 1, "--overwrite")
    assert result.exit_code != 0, f"seed={seed}: {everything(result)}"
    assert digest(files_under(tmp_path / "out")) == before, f"seed={seed}: existing outputs changed"
    no_temporary_files(tmp_path, seed)


def test_a_later_output_that_cannot_be_written_exits_6_and_names_it(tmp_path: Path) -> None:
    seed = fresh_seed()
    spec, _ = blocked_second_output(tmp_path, seed)
    result = run(spec, seed + 1, "--overwrite")
    assert result.exit_code == 6, f"seed={seed}: exit {result.exit_code}: {everything(result)}"
    assert "q2.parquet" in result.stderr, f"seed={seed}: {result.stderr}"


def test_an_interrupt_while_publishing_publishes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    write_csv_with_a_late_bad_value(tmp_path / "late.csv", rng, bad=None)
    spec = two_query_spec(tmp_path, rng, "late.csv")
    run_ok(spec, seed)
    before = digest(files_under(tmp_path / "out"))
    real_markdown = render.explanation_markdown

    def interrupted_markdown(*args: Any, **kwargs: Any) -> str:
        # Rendered while staging report.md, after both outputs and report.json are staged.
        signal.raise_signal(signal.SIGINT)
        return real_markdown(*args, **kwargs)

    monkeypatch.setattr(render, "explanation_markdown", interrupted_markdown)
    result = run(spec, seed + 1, "--overwrite")
    assert result.exit_code == 130, f"seed={seed}: exit {result.exit_code}: {everything(result)}"
    assert "interrupted" in result.stderr.lower(), f"seed={seed}: {result.stderr}"
    assert digest(files_under(tmp_path / "out")) == before, f"seed={seed}: existing outputs changed"
    no_temporary_files(tmp_path, seed)


def test_a_signal_while_the_scratch_folder_is_removed_stops_the_run_after_it_is_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM that lands inside the removal of the scratch folder (all queries ran) must not
    cut the removal short, which would leave private intermediate files behind; the run then
    stops as for any signal before publication."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    write_csv_with_a_late_bad_value(tmp_path / "late.csv", rng, bad=None)
    spec = two_query_spec(tmp_path, rng, "late.csv")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("DPRUN_TMPDIR", str(scratch))
    real_rmtree = shutil.rmtree

    def interrupted_rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
        if Path(path).parent == scratch:
            signal.raise_signal(signal.SIGTERM)
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", interrupted_rmtree)
    result = run(spec, seed)
    assert result.exit_code == 130, f"seed={seed}: exit {result.exit_code}: {everything(result)}"
    assert "nothing was published" in everything(result), f"seed={seed}: {everything(result)}"
    assert list(scratch.iterdir()) == [], f"seed={seed}: scratch files left: {list(scratch.rglob('*'))}"
    assert not (tmp_path / "out").exists() or not files_under(tmp_path / "out"), f"seed={seed}: something published"


def test_a_signal_after_publication_lets_the_run_finish_and_succeed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    write_csv_with_a_late_bad_value(tmp_path / "late.csv", rng, bad=None)
    spec = two_query_spec(tmp_path, rng, "late.csv")
    real_summary = render.print_summary

    def interrupted_summary(*args: Any, **kwargs: Any) -> None:
        # Every output is in place: stopping now would claim that nothing was published.
        signal.raise_signal(signal.SIGTERM)
        real_summary(*args, **kwargs)

    monkeypatch.setattr(render, "print_summary", interrupted_summary)
    result = run(spec, seed)
    assert result.exit_code == 0, f"seed={seed}: exit {result.exit_code}: {everything(result)}"
    assert "nothing was published" not in everything(result), f"seed={seed}: {everything(result)}"
    assert "total: ε=" in result.stdout, f"seed={seed}: the summary was cut short: {result.stdout}"
    published = sorted(files_under(tmp_path / "out"))
    assert published == ["q1.parquet", "q2.csv", "report.html", "report.json", "report.md"], f"seed={seed}: {published}"


# --- overwriting --------------------------------------------------------------------------


def test_existing_outputs_are_refused_without_overwrite(tmp_path: Path) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    visits(rng).write_parquet(tmp_path / "visits.parquet")
    q = query("per_shop", "visits", "out/per_shop.parquet", COUNT_AND_SUM, group_by=["shop"],
              partitions={"public": SHOPS})
    spec = write_spec(tmp_path, {"visits": "visits.parquet"}, [q])
    run_ok(spec, seed)
    output = tmp_path.resolve() / "out" / "per_shop.parquet"
    before = digest(files_under(tmp_path / "out"))

    result = run(spec, seed + 1)
    assert result.exit_code == 6, f"seed={seed}: exit {result.exit_code}: {everything(result)}"
    assert str(output) in result.stderr, f"seed={seed}: the message does not name {output}: {result.stderr}"
    assert "--overwrite" in result.stderr, f"seed={seed}: {result.stderr}"
    assert digest(files_under(tmp_path / "out")) == before, f"seed={seed}: something was written"
    no_temporary_files(tmp_path, seed)


def test_output_overwrite_true_in_the_spec_replaces_the_output(tmp_path: Path) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    visits(rng).write_parquet(tmp_path / "visits.parquet")
    q = query("per_shop", "visits", "out/per_shop.parquet", COUNT_AND_SUM, group_by=["shop"],
              partitions={"public": SHOPS})
    run_ok(write_spec(tmp_path, {"visits": "visits.parquet"}, [q]), seed)
    output = tmp_path / "out" / "per_shop.parquet"
    first = pl.read_parquet(output)

    q["output"]["overwrite"] = True
    spec = write_spec(tmp_path, {"visits": "visits.parquet"}, [q])
    run_ok(spec, seed + 1)
    second = pl.read_parquet(output)
    assert second["shop"].to_list() == first["shop"].to_list() == SHOPS
    # A new seed gives new noise: the continuous sums cannot all repeat.
    assert second["spend"].to_list() != first["spend"].to_list(), f"seed={seed}: the output was not replaced"
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["spec_sha256"] == hashlib.sha256(spec.read_bytes()).hexdigest(), f"seed={seed}"
    no_temporary_files(tmp_path, seed)


def test_the_same_seed_reproduces_the_release(tmp_path: Path) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    visits(rng).write_parquet(tmp_path / "visits.parquet")
    q = query("per_shop", "visits", "out/per_shop.csv", COUNT_AND_SUM, group_by=["shop"],
              partitions={"public": SHOPS})
    spec = write_spec(tmp_path, {"visits": "visits.parquet"}, [q])
    run_ok(spec, seed)
    first = (tmp_path / "out" / "per_shop.csv").read_bytes()
    run_ok(spec, seed, "--overwrite")
    assert (tmp_path / "out" / "per_shop.csv").read_bytes() == first, f"seed={seed}: --seed is not deterministic"


def test_an_output_at_the_markdown_report_path_is_refused(tmp_path: Path) -> None:
    seed = fresh_seed()
    visits(np.random.default_rng(seed)).write_parquet(tmp_path / "visits.parquet")
    q = query("per_shop", "visits", "out/report.md", COUNT_AND_SUM, group_by=["shop"], partitions={"public": SHOPS})
    q["output"]["format"] = "csv"
    spec = write_spec(tmp_path, {"visits": "visits.parquet"}, [q])
    result = run(spec, seed)
    assert result.exit_code == 1, f"seed={seed}: exit {result.exit_code}: {everything(result)}"
    assert not (tmp_path / "out").exists(), f"seed={seed}"


# --- the report ---------------------------------------------------------------------------

# Planted facts about the raw data. None may appear in anything dprun prints or writes: they are
# not DP. All have four or five digits and lie far from every released per-partition number
# (partition counts ≈ 800, unit counts ≈ 750, sums < 1,000, means in [0, 1]).
N_ROWS = 24_683
N_UNITS = 1_907
N_FILTERED = 3_571  # rows the spec's filter removes
N_NO_UNIT = 2_203  # rows without a privacy unit
N_CLAMPED = 4_127  # values above the upper bound
PLANTED = (N_ROWS, N_UNITS, N_FILTERED, N_NO_UNIT, N_CLAMPED, N_ROWS - N_FILTERED, N_ROWS - N_NO_UNIT,
           N_ROWS - N_FILTERED - N_NO_UNIT)


def planted_data(rng: np.random.Generator) -> pl.DataFrame:
    normal = N_ROWS - N_FILTERED - N_NO_UNIT - N_CLAMPED
    values = np.concatenate([rng.uniform(0, 1, normal), np.full(N_FILTERED, -1.0),
                             rng.uniform(0, 1, N_NO_UNIT), np.full(N_CLAMPED, 5.0)])
    with_unit = N_ROWS - N_NO_UNIT
    units = np.concatenate([rng.permutation(N_UNITS), rng.integers(0, N_UNITS, with_unit - N_UNITS)])
    uid = pl.Series("uid", [*units[:normal].tolist(), *units[normal:normal + N_FILTERED].tolist(),
                            *([None] * N_NO_UNIT), *units[normal + N_FILTERED:].tolist()], dtype=pl.Int64)
    frame = pl.DataFrame({"uid": uid, "shop": [f"s{k:02d}" for k in rng.integers(0, 20, N_ROWS)], "v": values})
    assert frame.height == N_ROWS and frame["uid"].drop_nulls().n_unique() == N_UNITS
    assert frame.filter(pl.col("v") >= 0)["uid"].drop_nulls().n_unique() == N_UNITS
    return frame.sample(fraction=1.0, shuffle=True, seed=int(rng.integers(2**32)))


def mentions(text: str, number: int) -> bool:
    """Whether `number` is written in `text` as a number of its own (plain or with separators)."""
    forms = {str(number), f"{number:,}", f"{number:_}", f"{number:,}".replace(",", " ")}
    return any(re.search(rf"(?<![\w.,]){re.escape(form)}(?![\w,])", text) for form in forms)


def test_the_report_accounts_for_the_budget_and_leaks_no_raw_statistic(tmp_path: Path) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    data = tmp_path / "data" / "visits.parquet"
    data.parent.mkdir()
    planted_data(rng).write_parquet(data)
    shops = [f"s{k:02d}" for k in range(20)]
    metrics = [{"name": "visits", "kind": "count"}, {"name": "people", "kind": "privacy_id_count"},
               {"name": "total", "kind": "sum", "column": "v", "bounds": [0, 1]},
               {"name": "avg", "kind": "mean", "column": "v", "bounds": [0, 1]}]
    spec = write_spec(tmp_path, {"visits": "data/visits.parquet"}, [
        query("per_shop", "visits", "out/per_shop.csv", metrics, group_by=["shop"], partitions={"public": shops},
              l0=20, m=3, filter="v >= 0"),
        query("overall", "visits", "out/overall.parquet", [{"name": "avg", "kind": "mean", "column": "v",
                                                            "bounds": [0, 1]}], l0=1, m=5),
    ], epsilon=1.5, delta=1e-6)
    result = run_ok(spec, seed)

    report_json, report_md = tmp_path / "out" / "report.json", tmp_path / "out" / "report.md"
    assert report_json.is_file() and report_md.is_file(), f"seed={seed}: {list(files_under(tmp_path / 'out'))}"
    report = json.loads(report_json.read_text())
    assert report["non_private_test_seed"] is True, f"seed={seed}"
    assert "NOT private" in report_md.read_text(), f"seed={seed}: report.md does not warn about the test seed"
    assert 0 < report["total"]["epsilon"] <= report["budget"]["epsilon"] == 1.5, f"seed={seed}: {report['total']}"
    assert 0 <= report["total"]["delta"] <= report["budget"]["delta"] == 1e-6, f"seed={seed}: {report['total']}"
    assert [q["name"] for q in report["queries"]] == ["per_shop", "overall"]
    assert [q["partitions_released"] for q in report["queries"]] == [20, 1], f"seed={seed}"
    assert not {"inputs", "started", "finished"} & set(report), f"seed={seed}: non-DP facts in the report"
    size, digests = data.stat().st_size, (hashlib.sha256(data.read_bytes()).hexdigest(),
                                           file_fingerprint(data, "parquet"))

    def scrub(text: str) -> str:
        # The command's own output may show this machine's paths; published files may not.
        for folder in {str(tmp_path.resolve()), str(tmp_path)}:
            text = text.replace(folder, "<tmp>")
        return text

    published = {"report.json": report_json.read_text(), "report.md": report_md.read_text(),
                 "per_shop.csv": (tmp_path / "out" / "per_shop.csv").read_text()}
    for name, text in published.items():
        assert str(tmp_path.resolve()) not in text and str(tmp_path) not in text, f"seed={seed}: {name}: a path"
        assert not any(d in text for d in digests), f"seed={seed}: {name} holds the input's hash"
        assert not mentions(text, size), f"seed={seed}: {name} mentions the input's size {size}"
    texts = {**published, "stdout": scrub(result.stdout), "stderr": scrub(result.stderr)}
    for name, text in texts.items():
        for number in PLANTED:
            assert not mentions(text, number), f"seed={seed}: {name} mentions the raw statistic {number}:\n{text}"
    per_shop = pl.read_csv(tmp_path / "out" / "per_shop.csv")
    assert per_shop["shop"].to_list() == shops, f"seed={seed}"
    for column in ("visits", "people"):
        leaked = set(per_shop[column].to_list()) & set(PLANTED)
        assert not leaked, f"seed={seed}: output column {column} holds a raw statistic {leaked}"


@pytest.mark.parametrize(("accounting", "partitions"), [
    ("basic", "public"), ("basic", "private"), ("pld", "public"), ("pld", "private"),
])
def test_the_reported_total_stays_within_the_budget(tmp_path: Path, accounting: str, partitions: str) -> None:
    seed = fresh_seed()
    visits(np.random.default_rng(seed), rows=20_000).write_parquet(tmp_path / "visits.parquet")
    per_day = query("per_day", "visits", "out/per_day.parquet", COUNT_AND_SUM, group_by=["day"], l0=2, m=2,
                    partitions={"public": [f"d{k}" for k in range(7)]} if partitions == "public" else None)
    overall = query("overall", "visits", "out/overall.parquet", COUNT_AND_SUM, l0=2, m=2)
    spec = write_spec(tmp_path, {"visits": "visits.parquet"}, [per_day, overall], epsilon=1.0, delta=1e-6,
                      accounting=accounting)
    run_ok(spec, seed)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["accounting"] == accounting
    total, budget = report["total"], report["budget"]
    assert 0 < total["epsilon"] <= budget["epsilon"], f"seed={seed}: total {total} exceeds budget {budget}"
    assert 0 <= total["delta"] <= budget["delta"], f"seed={seed}: total {total} exceeds budget {budget}"


def test_run_format_json_prints_one_parseable_summary(tmp_path: Path) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    visits(rng, rows=20_000).write_parquet(tmp_path / "visits.parquet")
    spec = write_spec(tmp_path, {"visits": "visits.parquet"}, [
        query("per_shop", "visits", "out/per_shop.parquet", COUNT_AND_SUM, group_by=["shop"],
              partitions={"public": [*SHOPS, "closed-shop"]}),
        query("per_day", "visits", "out/per_day.csv", [{"name": "people", "kind": "privacy_id_count"}],
              group_by=["day"], l0=7),
        query("overall", "visits", "out/overall.parquet", COUNT_AND_SUM, l0=1, m=10),
    ], epsilon=3.0, delta=1e-5)
    result = run_ok(spec, seed, "--format", "json")
    summary = json.loads(result.stdout)
    assert summary["ok"] is True and summary["non_private_test_seed"] is True, f"seed={seed}: {summary}"
    assert Path(summary["report"]) == tmp_path.resolve() / "out" / "report.json"
    assert [q["name"] for q in summary["queries"]] == ["per_shop", "per_day", "overall"]
    heights = {
        "per_shop": pl.read_parquet(tmp_path / "out" / "per_shop.parquet").height,
        "per_day": pl.read_csv(tmp_path / "out" / "per_day.csv").height,
        "overall": pl.read_parquet(tmp_path / "out" / "overall.parquet").height,
    }
    released = {q["name"]: q["partitions_released"] for q in summary["queries"]}
    assert released == heights, f"seed={seed}: {released} vs files {heights}"
    assert released["per_shop"] == 9 and released["overall"] == 1, f"seed={seed}: {released}"
    # ~2,300 units per day with L0 = 7: every day is far above the selection threshold.
    assert released["per_day"] == 7, f"seed={seed}: {released}"
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert {q["name"]: q["partitions_released"] for q in report["queries"]} == released
    assert summary["total"] == report["total"]


# --- exit codes and messages --------------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "validate", "explain-budget"])
def test_a_missing_spec_exits_1_and_names_the_file(tmp_path: Path, command: str) -> None:
    missing = tmp_path / "no-such-spec.yaml"
    result = invoke(command, str(missing))
    no_traceback(result)
    assert result.exit_code == 1, f"exit {result.exit_code}: {everything(result)}"
    assert "no-such-spec.yaml" in result.stderr, everything(result)

    result = invoke(command, str(missing), "--format", "json")
    no_traceback(result)
    assert result.exit_code == 1, everything(result)
    answer = json.loads(result.stdout)
    assert answer["ok"] is False and answer["exit_code"] == 1
    assert any("no-such-spec.yaml" in p["file"] for p in answer["problems"]), answer


def bad_specs(folder: Path) -> dict[str, tuple[str, str]]:
    """name → (spec text, a word the message must contain)."""
    pl.DataFrame({"uid": [1, 2], "shop": ["a", "b"], "spend": [1.0, 2.0]}).write_parquet(folder / "visits.parquet")
    good = {
        "version": 1, "privacy_unit": "uid", "budget": {"epsilon": 1.0, "delta": 1e-6},
        "inputs": {"visits": {"path": "visits.parquet"}},
        "queries": [query("q", "visits", "out/q.parquet", COUNT_AND_SUM[:1], group_by=["shop"],
                          partitions={"public": ["a", "b"]})],
        "report": "out/report.json",
    }

    def variant(change: Any) -> str:
        spec = json.loads(json.dumps(good))
        change(spec)
        return json.dumps(spec, indent=2)

    return {
        "misspelt field": (variant(lambda s: s["budget"].update(epsilno=1.0)), "epsilno"),
        "negative epsilon": (variant(lambda s: s["budget"].update(epsilon=-1)), "epsilon"),
        "missing input file": (variant(lambda s: s["inputs"]["visits"].update(path="nowhere.parquet")),
                               "nowhere.parquet"),
        "unknown column": (variant(lambda s: s["queries"][0].update(group_by=["colour"])), "colour"),
        "sum without bounds": (variant(lambda s: s["queries"][0].update(
            metrics=[{"name": "s", "kind": "sum", "column": "spend"}])), "bounds"),
        "not yaml": ("version: 1\nbudget: [epsilon: 1\n", "spec.yaml"),
    }


@pytest.mark.parametrize("case", ["misspelt field", "negative epsilon", "missing input file", "unknown column",
                                  "sum without bounds", "not yaml"])
def test_an_invalid_spec_exits_1_with_a_located_message(tmp_path: Path, case: str) -> None:
    text, word = bad_specs(tmp_path)[case]
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    result = invoke("run", str(spec), "--seed", "1")
    no_traceback(result)
    assert result.exit_code == 1, f"{case}: exit {result.exit_code}: {everything(result)}"
    assert result.stderr.startswith("error: "), f"{case}: {result.stderr}"
    assert word in result.stderr and str(spec) in result.stderr, f"{case}: {result.stderr}"
    assert not (tmp_path / "out").exists(), f"{case}: an invalid spec published something"


def test_usage_errors_exit_2_without_traceback(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("version: 1\n")
    for args in (["run"], ["run", str(spec), "--seed", "abc"], ["run", str(spec), "--format", "xml"],
                 ["run", str(spec), "--no-such-option"]):
        result = invoke(*args)
        no_traceback(result)
        assert result.exit_code == 2, f"{args}: exit {result.exit_code}: {everything(result)}"


def test_no_published_file_of_an_example_spec_holds_a_fact_about_its_inputs(tmp_path: Path) -> None:
    """Each shipped spec on the shipped data: no input size, hash, row count or unit count, no
    absolute path and no time of day in any published file (outputs, report.json, report.md)."""
    for folder in ("specs", "sample_data"):
        shutil.copytree(REPO / folder, tmp_path / folder)
    for spec in sorted((tmp_path / "specs").glob("*.yaml")):
        result = invoke("run", str(spec), "--overwrite")
        assert result.exit_code == 0, f"{spec.name}: {everything(result)}"
        validated = api.validate(spec)
        facts: set[int] = set()
        digests: set[str] = set()
        # Public lookup inputs are public data.
        for info in (i for i in validated.inputs.values() if not i.reading.public):
            for path in info.paths:
                frame = pl.read_parquet(path) if info.format == "parquet" else pl.read_csv(path)
                unit = validated.spec.privacy_unit_columns
                facts |= {path.stat().st_size, frame.height, frame.select(unit).n_unique()}
                digests |= {hashlib.sha256(path.read_bytes()).hexdigest(), file_fingerprint(path, info.format)}
        report_path = api.plan(validated).report_path
        report = json.loads(report_path.read_text())
        published = [report_path, report_path.with_suffix(".md")]
        published += [(spec.parent / q["output"]).resolve() for q in report["queries"]]
        for path in published:
            text = path.read_bytes().decode("utf-8", errors="replace")
            assert str(tmp_path) not in text and str(tmp_path.resolve()) not in text, f"{path.name}: a path"
            assert not any(d in text for d in digests), f"{spec.name}: {path.name} holds an input's hash"
            assert not [n for n in facts if mentions(text, n)], f"{spec.name}: {path.name} mentions {facts}"
            assert not re.search(r"\d\d:\d\d:\d\d", text), f"{spec.name}: {path.name} holds a time of day"


def test_without_a_terminal_the_summary_shows_long_names_and_paths_whole(tmp_path: Path) -> None:
    seed = fresh_seed()
    visits(np.random.default_rng(seed)).write_parquet(tmp_path / "visits.parquet")
    name = "visits_per_shop_for_the_quarterly_public_release_of_the_shops_dashboard"
    output = "out/" + "a_folder_name_longer_than_a_terminal_is_wide_" * 3 + "/per_shop.parquet"
    spec = write_spec(tmp_path, {"visits": "visits.parquet"}, [
        query(name, "visits", output, COUNT_AND_SUM, group_by=["shop"], partitions={"public": SHOPS})])
    for command in ("run", "explain-budget"):
        result = invoke(command, str(spec), *(("--seed", str(seed)) if command == "run" else ()))
        assert result.exit_code == 0, f"seed={seed}: {everything(result)}"
        assert name in result.stdout, f"seed={seed}: {command}: the query name was cut:\n{result.stdout}"
        if command == "run":
            assert output in result.stdout, f"seed={seed}: the output path was cut:\n{result.stdout}"
        assert "…" not in result.stdout, f"seed={seed}: {command}: something was cut:\n{result.stdout}"


def test_a_hive_partitioned_folder_releases_what_the_same_rows_in_one_file_release(tmp_path: Path) -> None:
    """The layout Spark's partitioned writer makes (`shop=s3/…parquet` without the column, a `_SUCCESS`),
    named by a file:// URL: the partition column is a column to group by and filter on, and the release
    is the one of the same rows in a single file, under the same seed."""
    seed = fresh_seed()
    rows = visits(np.random.default_rng(seed)).select("uid", "day", "spend", "shop")
    rows.write_parquet(tmp_path / "flat.parquet")
    rows.lazy().sink_parquet(pl.PartitionBy(str(tmp_path / "visits"), key="shop", include_key=False), mkdir=True)
    (tmp_path / "visits" / "_SUCCESS").write_text("")
    assert not list((tmp_path / "visits").glob("*.parquet")), "the rows are in partition folders only"
    released = {}
    for name, path in (("flat", "flat.parquet"), ("hive", f"file://{tmp_path / 'visits'}")):
        spec = write_spec(tmp_path, {"v": path}, [query(
            "q", "v", f"out/{name}.csv", COUNT_AND_SUM, group_by=["shop"], partitions={"public": SHOPS[:6]},
            l0=8, m=40, filter="shop != 's1'")], epsilon=4.0)
        run_ok(spec, seed)
        released[name] = pl.read_csv(tmp_path / "out" / f"{name}.csv")
    assert released["hive"]["shop"].to_list() == SHOPS[:6], f"seed={seed}"
    assert released["hive"].equals(released["flat"]), f"seed={seed}"
