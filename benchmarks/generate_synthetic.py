"""Generate the Plume paper's synthetic heavy-tailed dataset D_synth[n] as Parquet.

Plume (section 9.1) benchmarks DP aggregation on data that grows simply by
adding users:

* each user's number of records is drawn i.i.d. from a Zipf-Mandelbrot law on
  [1, 10^5] with s = 4.67, q = 25 (pmf proportional to 1 / (k + q)^s; mean
  about 10);
* each record's key is drawn i.i.d. from 10^6 keys (index 1..10^6) with a
  Zipf-Mandelbrot law, s = 1.4, q = 1000;
* a log-normal `value` column (2 decimals) gives sums and means something to
  aggregate;
* a `day` column (0..6, uniform, Int8) makes a compound privacy unit [user_id, day] and a
  two-column key [key, day] possible; it comes from a generator of its own, so the other
  columns are the same as before it was added.

Users are generated in chunks, and each chunk is written as row groups through
one ParquetWriter. Memory therefore stays bounded by the chunk size, and 10^7
users (about 10^8 rows) need under 1 GB of RAM. The output also prints
empirical checks against the paper's description.

Usage: python benchmarks/generate_synthetic.py --users 1000000 \\
           --out benchmarks/data/synth_1e6.parquet [--seed 7]
"""

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

MAX_RECORDS = 10**5
RECORDS_S, RECORDS_Q = 4.67, 25.0
N_KEYS = 10**6
KEYS_S, KEYS_Q = 1.4, 1000.0
HEAD_KEYS = 10**3  # The paper says the first 10^3 keys hold about 1/3 of records.
VALUE_MU, VALUE_SIGMA = 3.0, 1.0  # Log-normal parameters of `value`.
CHUNK_USERS = 10**6

SCHEMA = pa.schema([("user_id", pa.int64()), ("key", pa.int64()), ("value", pa.float64()), ("day", pa.int8())])
DAYS = 7


def zipf_mandelbrot_cdf(support: int, s: float, q: float) -> np.ndarray:
    """CDF on 1..support of the law with pmf proportional to 1 / (k + q)^s."""
    cumulative = np.cumsum((np.arange(1, support + 1, dtype=np.float64) + q) ** -s)
    return cumulative / cumulative[-1]


def sample(rng: np.random.Generator, cdf: np.ndarray, n: int) -> np.ndarray:
    """n i.i.d. draws in 1..len(cdf) by inverting the CDF."""
    return np.searchsorted(cdf, rng.random(n), side="right").astype(np.int64) + 1


@dataclass
class Stats:
    """Running totals for the sanity checks."""

    users: int = 0
    rows: int = 0
    users_over_10: int = 0
    head_key_rows: int = 0

    def print_checks(self, records_cdf: np.ndarray, keys_cdf: np.ndarray) -> None:
        """Print observed statistics next to their values under the sampling laws."""
        records_pmf = np.diff(records_cdf, prepend=0.0)
        checks = [
            (
                "mean records per user",
                self.rows / self.users,
                float(np.sum(records_pmf * np.arange(1, MAX_RECORDS + 1))),
            ),
            ("P(records > 10)", self.users_over_10 / self.users, 1.0 - records_cdf[9]),
            (
                f"share of records in first {HEAD_KEYS} keys",
                self.head_key_rows / self.rows,
                keys_cdf[HEAD_KEYS - 1],
            ),
        ]
        for name, observed, expected in checks:
            print(f"{name}: {observed:.4f} (law: {expected:.4f})")


def chunk_table(
    rng: np.random.Generator,
    day_rng: np.random.Generator,
    first_user: int,
    n_users: int,
    records_cdf: np.ndarray,
    keys_cdf: np.ndarray,
    stats: Stats,
) -> pa.Table:
    """Records of users first_user .. first_user + n_users - 1."""
    counts = sample(rng, records_cdf, n_users)
    user_ids = np.repeat(np.arange(first_user, first_user + n_users, dtype=np.int64), counts)
    keys = sample(rng, keys_cdf, user_ids.size)
    values = np.round(rng.lognormal(VALUE_MU, VALUE_SIGMA, user_ids.size), 2)
    stats.users += n_users
    stats.rows += user_ids.size
    stats.users_over_10 += int(np.count_nonzero(counts > 10))
    stats.head_key_rows += int(np.count_nonzero(keys <= HEAD_KEYS))
    days = day_rng.integers(0, DAYS, user_ids.size, dtype=np.int8)
    return pa.Table.from_arrays([user_ids, keys, values, days], schema=SCHEMA)


def generate(n_users: int, out: Path, seed: int) -> None:
    """Write D_synth[n_users] to out and print its size, timing and checks."""
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    day_rng = np.random.default_rng([seed, 1])
    records_cdf = zipf_mandelbrot_cdf(MAX_RECORDS, RECORDS_S, RECORDS_Q)
    keys_cdf = zipf_mandelbrot_cdf(N_KEYS, KEYS_S, KEYS_Q)
    stats = Stats()
    out.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(out, SCHEMA, compression="zstd") as writer:
        for first_user in range(0, n_users, CHUNK_USERS):
            n_chunk = min(CHUNK_USERS, n_users - first_user)
            table = chunk_table(rng, day_rng, first_user, n_chunk, records_cdf, keys_cdf, stats)
            writer.write_table(table)
    seconds = time.perf_counter() - started
    size_mib = out.stat().st_size / 2**20
    print(
        f"wrote {out}: {stats.rows:,} rows, {stats.users:,} users, "
        f"{size_mib:,.1f} MiB, {seconds:.1f} s"
    )
    stats.print_checks(records_cdf, keys_cdf)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, required=True, help="number of users n")
    parser.add_argument("--out", type=Path, required=True, help="output Parquet file")
    parser.add_argument("--seed", type=int, default=7, help="numpy generator seed (default 7)")
    args = parser.parse_args()
    if args.users < 1:
        parser.error("--users must be at least 1")
    return args


def main() -> None:
    args = parse_args()
    generate(args.users, args.out, args.seed)


if __name__ == "__main__":
    main()
