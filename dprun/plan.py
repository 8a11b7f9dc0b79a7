"""The plan: everything `run` will do and `explain-budget` prints, as plain data.

Built by `dprun.planner` from a validated spec and the input schemas only; no data
row is read to make it. Engines execute it step for step and never compute a
sensitivity, a noise scale or a threshold themselves.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from dprun.mechanisms.bound_choice import BoundChoicePlan, ChosenBounds
from dprun.mechanisms.noise import NoisePlan
from dprun.mechanisms.quantile_candidates import CandidatePlan
from dprun.mechanisms.quantities import Quantity
from dprun.mechanisms.selection import SelectionMechanism

if TYPE_CHECKING:
    # Only a type here: the card helper unpickles plans, and importing the spec's models (with
    # pydantic) would slow its start; a plan that holds one imports it as it is unpickled.
    from dprun.spec.models import PostProcess

PartitionMode = Literal["global", "public", "private"]


class Unplannable(ValueError):
    """The spec asks for something its budget cannot give; `path` locates it in the spec."""

    def __init__(self, path: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.path = path



@dataclass(frozen=True)
class NoisyQuantity:
    """A per-partition integer sum and the noise it is released with (candidate quantiles: their selection)."""

    quantity: Quantity
    noise: NoisePlan | CandidatePlan
    budget_share: float


@dataclass(frozen=True)
class MetricPlan:
    name: str
    kind: str
    column: str | None
    bounds: tuple[float, float] | None
    quantity_ids: tuple[str, ...]
    output_columns: tuple[str, ...]
    integer: bool  # released as integers (counts)
    levels: tuple[float, ...] = ()  # quantile levels, one output column each
    clamp: bool = False  # counts and sums: released within their feasible range (post-processing)
    quantile_method: str | None = None  # quantiles: "tree" or "candidates"
    quantile_reason: str | None = None  # why: set in the spec, the smaller predicted error, …
    # quantiles: each method's predicted root mean square rank error (counts) at this metric's share
    rank_error_by_method: tuple[tuple[str, float], ...] = ()
    value_unit: str | None = None  # the column's unit, for accuracy in its own terms


@dataclass(frozen=True)
class SelectionPlan:
    """How released partitions are chosen.

    mode `global`: one partition (no group_by); `public`: the listed keys, nothing else;
    `private`: `mechanism` decides from the privacy-unit count of each partition, or,
    for `released_count`, a threshold on the released noisy count `threshold_quantity`.
    """

    mode: PartitionMode
    mechanism: str | None = None
    detail: SelectionMechanism | None = None
    epsilon: float = 0.0
    delta: float = 0.0
    threshold_quantity: str | None = None
    threshold: float | None = None
    min_privacy_units: int = 1
    second_bounding: bool = False
    units_for_50pct: int | None = None
    units_for_95pct: int | None = None
    candidates: dict[str, int] = field(default_factory=dict)  # mechanism → units for a 50% keep chance


@dataclass(frozen=True)
class JoinPlan:
    """An input joined to a query's private input: a public lookup (unique `on` keys), or a private
    input joined on the privacy unit, whose rows per unit are first cut to `max_rows_per_unit`."""

    input: str
    on: tuple[str, ...]
    how: Literal["inner", "left"]
    public: bool
    max_rows_per_unit: int | None = None


@dataclass(frozen=True)
class QueryPlan:
    name: str
    input: str
    filter: str | None
    group_by: tuple[str, ...]
    privacy_unit: tuple[str, ...]
    max_partitions: int  # L0
    max_rows: int  # L∞ in rows per partition
    selection: SelectionPlan
    quantities: tuple[NoisyQuantity, ...]
    metrics: tuple[MetricPlan, ...]
    output_path: Path
    output_format: Literal["parquet", "csv"]
    overwrite: bool
    public_keys: Any = None  # polars DataFrame of public keys (mode `public`), else None
    epsilon: float = 0.0
    delta: float = 0.0
    derive: tuple[tuple[str, str], ...] = ()  # the query's derived columns: (name, SQL), in order
    joins: tuple[JoinPlan, ...] = ()  # the inputs joined to the private input, in order
    # rows each privacy unit keeps of the private input before a join of private inputs (None: all)
    input_max_rows_per_unit: int | None = None
    # `auto` contribution bounds: how they are chosen, and once chosen, what (max_partitions / max_rows hold it)
    bound_choice: BoundChoicePlan | None = None
    chosen_bounds: ChosenBounds | None = None
    sql: str | None = None  # the statement the query was written as, if it was
    postprocess: PostProcess | None = None  # HAVING, ORDER BY, LIMIT on the released table

    @property
    def private_input(self) -> str:
        """The private input's name (`input` is `private+joined+…` for a join)."""
        joined = "".join(f"+{join.input}" for join in self.joins)
        return self.input[: len(self.input) - len(joined)]

    @property
    def inputs(self) -> tuple[str, ...]:
        """Every input the query reads: its private input, then the inputs joined to it."""
        return (self.private_input, *(join.input for join in self.joins))

    @property
    def truncation(self) -> dict[str, int]:
        """Rows kept per privacy unit, by private input, before a join of private inputs."""
        bounds = {self.private_input: self.input_max_rows_per_unit}
        bounds |= {join.input: join.max_rows_per_unit for join in self.joins}
        return {name: bound for name, bound in bounds.items() if bound is not None}

    def quantity(self, quantity_id: str) -> NoisyQuantity:
        return next(q for q in self.quantities if q.quantity.id == quantity_id)


@dataclass(frozen=True)
class Plan:
    spec_name: str | None
    spec_path: Path
    spec_sha256: str
    accounting: Literal["basic", "pld"]
    budget_epsilon: float
    budget_delta: float
    total_epsilon: float  # the guarantee of the whole plan under its accounting (≤ budget)
    total_delta: float
    noise_multiplier: float  # < 1 when tight accounting allowed less noise than basic composition
    queries: tuple[QueryPlan, ...]
    report_path: Path

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready view of the plan (public keys are summarised by their number)."""
        data = asdict(self)
        for query, plan in zip(data["queries"], self.queries, strict=True):
            query["public_keys"] = None if plan.public_keys is None else len(plan.public_keys)
        return _jsonable(data)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value
