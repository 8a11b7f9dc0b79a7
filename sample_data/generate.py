"""Generate the synthetic restaurant-visit sample data shipped with dprun.

The data follows the running example of the "Differential privacy computations
in data pipelines" reference: one record per restaurant visit, with the visitor
as privacy unit. It is shaped so that the DP machinery has something to do:

* visits per visitor are heavy-tailed (most visit 1-3 times, a few regulars
  visit almost every day), so contribution bounding matters;
* restaurant popularity is very uneven (r01 busy ... r12 rare) and each visitor
  sticks to 1-3 favourite restaurants, so partitions differ widely in size;
* `restaurants.csv` lists r13 and r14, which never occur in the visits: public
  partitions with no data. Its `city` and `cuisine` columns make it a public lookup
  table to join with the visits.
* `visitors.csv` is a second private table (age band, home city per visitor) to join
  with the visits on the privacy unit; a few visitors who moved have two rows.

The generator is seeded, sorts its rows on every column and writes with
polars, so re-running it reproduces the files byte for byte.

Run from the repository root: ``python sample_data/generate.py``
"""

from datetime import date, timedelta
from pathlib import Path

import numpy as np
import polars as pl

SEED = 20261001
OUT_DIR = Path(__file__).resolve().parent

N_VISITORS = 20_000
N_RESTAURANTS = 12
EMPTY_RESTAURANTS = ("r13", "r14")
POPULARITY_EXPONENT = 1.6  # Zipf exponent of restaurant popularity by rank.

FIRST_DAY = date(2026, 10, 1)
N_DAYS = 31
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
WEEKDAY_WEIGHTS = (0.8, 0.8, 0.9, 1.0, 1.4, 1.6, 1.1)  # Busier at weekends.

# Visitor tiers: (share of visitors, min visits, max visits).
LIGHT = (0.75, 1, 3)
MEDIUM = (0.20, 4, 12)
# The remaining visitors are regulars with 13-31 visits (up to one a day), log-uniformly.
HEAVY_MIN, HEAVY_MAX = 13, 31

SPEND_SIGMA = 0.35  # Log-normal spread of a meal's price around the median.
OUTLIER_RATE = 0.003  # Group dinners and the like: 120-400 EUR.
OUTLIER_MIN, OUTLIER_MAX = 120.0, 400.0
MISSING_RATE = 0.01


def restaurant_ids() -> list[str]:
    """Ids r01..r12, most popular first."""
    return [f"r{i:02d}" for i in range(1, N_RESTAURANTS + 1)]


def popularity() -> np.ndarray:
    """Probability of each restaurant being picked as a favourite."""
    weights = np.arange(1, N_RESTAURANTS + 1, dtype=np.float64) ** -POPULARITY_EXPONENT
    return weights / weights.sum()


def visits_per_visitor(rng: np.random.Generator) -> np.ndarray:
    """Heavy-tailed number of visits for each visitor."""
    tier = rng.random(N_VISITORS)
    light = tier < LIGHT[0]
    medium = (tier >= LIGHT[0]) & (tier < LIGHT[0] + MEDIUM[0])
    heavy = ~(light | medium)
    counts = np.empty(N_VISITORS, dtype=np.int64)
    counts[light] = rng.integers(LIGHT[1], LIGHT[2] + 1, light.sum())
    counts[medium] = rng.integers(MEDIUM[1], MEDIUM[2] + 1, medium.sum())
    log_heavy = rng.uniform(np.log(HEAVY_MIN), np.log(HEAVY_MAX + 1), heavy.sum())
    counts[heavy] = np.floor(np.exp(log_heavy)).astype(np.int64)
    return counts


def visited_restaurants(rng: np.random.Generator, counts: np.ndarray) -> np.ndarray:
    """Restaurant index of every visit, each visitor going to 1-3 favourites."""
    weights = popularity()
    visits = []
    for n_visits in counts:
        n_favourites = min(int(rng.integers(1, 4)), int(n_visits))
        favourites = rng.choice(N_RESTAURANTS, n_favourites, replace=False, p=weights)
        preference = rng.dirichlet(np.ones(n_favourites))
        visits.append(rng.choice(favourites, int(n_visits), p=preference))
    return np.concatenate(visits)


def visit_days(rng: np.random.Generator, n: int) -> list[date]:
    """Day of each visit within the month, weekends being busier."""
    days = [FIRST_DAY + timedelta(days=i) for i in range(N_DAYS)]
    weights = np.array([WEEKDAY_WEIGHTS[d.weekday()] for d in days])
    picks = rng.choice(N_DAYS, n, p=weights / weights.sum())
    return [days[i] for i in picks]


def spends(rng: np.random.Generator, restaurants: np.ndarray) -> np.ndarray:
    """Amount spent per visit in EUR; NaN marks a missing value."""
    median_by_restaurant = rng.uniform(12.0, 32.0, N_RESTAURANTS)
    n = restaurants.size
    amount = median_by_restaurant[restaurants] * rng.lognormal(0.0, SPEND_SIGMA, n)
    outliers = rng.random(n) < OUTLIER_RATE
    amount[outliers] = rng.uniform(OUTLIER_MIN, OUTLIER_MAX, outliers.sum())
    amount[rng.random(n) < MISSING_RATE] = np.nan
    return np.round(amount, 2)


def visits_frame(rng: np.random.Generator) -> pl.DataFrame:
    """All visits, sorted on every column."""
    counts = visits_per_visitor(rng)
    visitors = np.repeat(np.arange(1, N_VISITORS + 1), counts)
    restaurants = visited_restaurants(rng, counts)
    days = visit_days(rng, visitors.size)
    ids = restaurant_ids()
    frame = pl.DataFrame(
        {
            "visitor_id": [f"v{v:06d}" for v in visitors],
            "restaurant_id": [ids[r] for r in restaurants],
            "day": [d.isoformat() for d in days],
            "weekday": [WEEKDAYS[d.weekday()] for d in days],
            "spend_eur": pl.Series(spends(rng, restaurants), nan_to_null=True),
        }
    )
    return frame.sort(["day", "restaurant_id", "visitor_id", "spend_eur"], nulls_last=True)


CITIES = ("Lyon", "Nantes", "Lille")
CUISINES = ("bistro", "pizzeria", "ramen", "vegetarian")


def restaurants_frame() -> pl.DataFrame:
    """Public list of restaurants, including two that have no visits, with their city and cuisine."""
    ids = restaurant_ids() + list(EMPTY_RESTAURANTS)
    return pl.DataFrame({
        "restaurant_id": ids,
        "city": [CITIES[i % len(CITIES)] for i in range(len(ids))],
        "cuisine": [CUISINES[(i * 3 + i // 4) % len(CUISINES)] for i in range(len(ids))],
    })


AGE_BANDS = ("18-24", "25-34", "35-49", "50-64", "65+")
AGE_WEIGHTS = (0.14, 0.26, 0.28, 0.20, 0.12)
MOVED_RATE = 0.02  # Visitors who moved this month: two rows, one per home city.


def visitors_frame() -> pl.DataFrame:
    """Private profile of each visitor (age band, home city); a few who moved have two rows.

    Drawn from its own generator, so the visits stay the same byte for byte.
    """
    rng = np.random.default_rng(SEED + 1)
    ids = [f"v{v:06d}" for v in range(1, N_VISITORS + 1)]
    bands = rng.choice(len(AGE_BANDS), N_VISITORS, p=AGE_WEIGHTS)
    cities = rng.integers(0, len(CITIES), N_VISITORS)
    moved = np.flatnonzero(rng.random(N_VISITORS) < MOVED_RATE)
    new_cities = (cities[moved] + rng.integers(1, len(CITIES), moved.size)) % len(CITIES)
    frame = pl.DataFrame({
        "visitor_id": ids + [ids[i] for i in moved],
        "age_band": [AGE_BANDS[b] for b in bands] + [AGE_BANDS[bands[i]] for i in moved],
        "home_city": [CITIES[c] for c in cities] + [CITIES[c] for c in new_cities],
    })
    return frame.sort(["visitor_id", "home_city"])


def main() -> None:
    rng = np.random.default_rng(SEED)
    visits = visits_frame(rng)
    visits.write_csv(OUT_DIR / "visits.csv", float_precision=2)
    visits.write_parquet(OUT_DIR / "visits.parquet", compression="zstd", statistics=True)
    restaurants_frame().write_csv(OUT_DIR / "restaurants.csv")
    visitors_frame().write_csv(OUT_DIR / "visitors.csv")
    print(
        f"{visits.height} visits by {visits['visitor_id'].n_unique()} visitors "
        f"written to {OUT_DIR}"
    )


if __name__ == "__main__":
    main()
