"""The spec language, version 1: pydantic models whose field names are the public contract.

docs/spec.md documents every field; docs/dprun.schema.json is generated from these
models (`dprun schema`) and a test keeps it current.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

NoiseChoice = Literal["auto", "laplace", "gaussian"]
SelectionChoice = Literal[
    "auto", "truncated_geometric", "laplace_threshold", "gaussian_threshold", "weighted_gaussian_threshold",
    "released_count"
]
MetricKind = Literal[
    "count", "privacy_id_count", "sum", "mean", "variance", "stddev",
    "quantile", "median", "min", "max",
]
QUANTILE_KINDS: frozenset[str] = frozenset({"quantile", "median", "min", "max"})
CLAMPABLE_KINDS: frozenset[str] = frozenset({"count", "privacy_id_count", "sum"})
KINDS_WITH_VALUES: frozenset[str] = frozenset(
    {"sum", "mean", "variance", "stddev", "quantile", "median", "min", "max"}
)

BOUND_LIMIT = 1e200
PositiveWeight = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Scalar = str | int | float | bool
# Above this budget ε, PLD accounting's privacy-loss grid (10^-3 at the finest) holds too
# many points to compute in seconds; such budgets give no meaningful privacy anyway.
PLD_MAX_EPSILON = 100.0
# Linux's limits (NAME_MAX, PATH_MAX): a longer path fails in the OS, not in dprun.
NAME_MAX_BYTES = 255
PATH_MAX_BYTES = 4095


def _usable_path(value: str) -> str:
    """A path the operating system can take: no NUL character, no over-long name."""
    if "\x00" in value:
        raise ValueError("a path cannot contain a NUL character")
    encoded = value.encode("utf-8", errors="surrogateescape")
    if len(encoded) > PATH_MAX_BYTES:
        raise ValueError(f"the path is longer than {PATH_MAX_BYTES} bytes")
    if any(len(part) > NAME_MAX_BYTES for part in encoded.split(b"/")):
        raise ValueError(f"a name in the path is longer than {NAME_MAX_BYTES} bytes")
    return value


PathText = Annotated[str, Field(min_length=1), AfterValidator(_usable_path)]
# A derived column's name: usable unquoted in a filter or another derived column's SQL.
ColumnName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class Strict(BaseModel):
    # An unknown field is an error: a misspelt `epsilon` must never fall back to a default.
    # Strict types: `epsilon: true` or `epsilon: "1"` is an error, not 1.0.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Lifetime(Strict):
    epsilon: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    delta: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] = 0.0


class Budget(Strict):
    epsilon: Annotated[float, Field(gt=0, allow_inf_nan=False, description="Total ε for the whole spec.")]
    delta: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False, description="Total δ; 0 means pure DP.")] = 0.0
    accounting: Literal["auto", "basic", "pld"] = Field(default="auto", description=(
        "How the parts' guarantees compose: `basic` adds them up; `pld` composes the noise's privacy loss "
        "distributions (tighter, so less noise); `auto`: `pld` where it applies (δ > 0, ε at most 100), else basic."))
    lifetime: Lifetime | None = Field(default=None, description="Most any dataset may spend over all releases (ledger).")

    @property
    def method(self) -> Literal["basic", "pld"]:
        """The accounting used: `auto` is `pld` where tight composition can lower the noise, never looser."""
        if self.accounting != "auto":
            return self.accounting
        return "pld" if self.delta > 0 and self.epsilon <= PLD_MAX_EPSILON else "basic"

    @model_validator(mode="after")
    def _pld_range(self) -> Budget:
        if self.accounting == "pld" and self.epsilon > PLD_MAX_EPSILON:
            raise ValueError(f"`accounting: pld` takes epsilon up to {PLD_MAX_EPSILON:g}; use `basic` above that")
        return self


ColumnTypeName = Literal["int64", "float64", "string", "bool", "date", "datetime"]
# Reading options that only a CSV file has (`input_schema` refuses them for other formats).
CSV_OPTIONS = ("separator", "quote_char", "null_values", "has_header", "encoding", "comment_prefix")


class ColumnType(Strict):
    type: ColumnTypeName
    format: str | None = Field(default=None, min_length=1,
                               description="date/datetime: a strftime-style format such as %d/%m/%Y.")

    @model_validator(mode="after")
    def _format_for_dates(self) -> ColumnType:
        if self.format is not None and self.type not in ("date", "datetime"):
            raise ValueError(f"`format` is only for date and datetime columns, not {self.type}")
        return self


class InputSpec(Strict):
    path: PathText = Field(description="A file, a folder (Hive partition folders give columns) or a glob, or a "
                                       "file:// URL of one; relative to the spec file.")
    format: Literal["csv", "parquet", "ndjson"] | None = None
    separator: str = Field(default=",", min_length=1, max_length=1, description="CSV: the field separator.")
    quote_char: str | None = Field(default='"', min_length=1, max_length=1,
                                   description="CSV: the quote character; null for none.")
    null_values: list[str] = Field(default_factory=list, description="CSV: texts that mean a missing value.")
    has_header: bool = Field(default=True, description="CSV: the first line names the columns.")
    encoding: Literal["utf8", "utf8-lossy"] = "utf8"
    comment_prefix: str | None = Field(default=None, min_length=1, max_length=5,
                                       description="CSV: lines starting with this are skipped.")
    columns: dict[str, ColumnTypeName | ColumnType] = Field(
        default_factory=dict, description=(
            "Column types to read with. CSV: a column not listed is float64 where a metric takes its values, else "
            "text; NDJSON: required, the input's columns; Parquet: a cast of the footer's type."))
    derive: dict[ColumnName, str] = Field(
        default_factory=dict, description="New columns, each a row-wise Polars SQL expression of the input's columns.")
    public: bool = Field(default=False, description=(
        "A public lookup table: read whole, it holds no privacy unit, and it can only be joined to a private "
        "input (its values may then be partition keys)."))

    @field_validator("separator", "quote_char")
    @classmethod
    def _one_byte(cls, value: str | None) -> str | None:
        if value is not None and (len(value.encode("utf-8")) != 1 or value in "\r\n"):
            raise ValueError("must be one ASCII character other than a line break")
        return value

    @model_validator(mode="after")
    def _quote_apart_from_separator(self) -> InputSpec:
        if self.quote_char is not None and self.quote_char == self.separator:
            raise ValueError("`quote_char` and `separator` are the same character: a field could not be told "
                             "from a quote; give one of them another character")
        return self

    def column_types(self) -> dict[str, ColumnType]:
        return {name: ColumnType(type=kind) if isinstance(kind, str) else kind for name, kind in self.columns.items()}


class PublicColumn(Strict):
    """The public values of one group_by column, read from a column of a CSV or Parquet file."""

    file: PathText
    column: str = Field(min_length=1)


PublicKeys = list[Scalar | list[Scalar]] | dict[str, list[Scalar] | PublicColumn]


class Partitions(Strict):
    public: PublicKeys | None = Field(
        default=None, description="The released partition keys: a list (one value per key, or a list per key for "
        "several group_by columns), or a mapping from each group_by column to its values, meaning every combination."
    )
    public_file: PathText | None = Field(default=None, description="CSV/Parquet file holding the group_by columns.")
    selection: SelectionChoice = "auto"
    budget_share: PositiveWeight | None = Field(default=None, description=(
        "The weight of private partition selection in its query's ε and δ split. Default: 1, or 0.5 for "
        "weighted_gaussian_threshold."))
    min_privacy_units: Annotated[int, Field(ge=1)] = 1
    second_bounding: bool = True

    @model_validator(mode="after")
    def _one_source(self) -> Partitions:
        if self.public is not None and self.public_file is not None:
            raise ValueError("give either `public` or `public_file`, not both")
        return self

    @property
    def is_public(self) -> bool:
        return self.public is not None or self.public_file is not None

    def key_files(self) -> list[tuple[tuple[str, ...], str, str | None]]:
        """Every file the public keys are read from: the field that names it (below `partitions`),
        its path, and the column read from it (None: the group_by columns, as `public_file`)."""
        files: list[tuple[tuple[str, ...], str, str | None]] = []
        if self.public_file is not None:
            files.append((("public_file",), self.public_file, None))
        if isinstance(self.public, dict):
            files += [(("public", column, "file"), values.file, values.column) for column, values in self.public.items()
                      if isinstance(values, PublicColumn)]
        return files


Bound = Annotated[int, Field(ge=1, le=10**6)]
_BOUND: TypeAdapter[int] = TypeAdapter(Bound)
_PAIR: TypeAdapter[tuple[float, float]] = TypeAdapter(tuple[float, float])
AUTO_BOUNDS_DESCRIPTION = "A whole number, or `auto`: chosen from the data with differential privacy."


class ContributionBounds(Strict):
    max_partitions_contributed: Bound | Literal["auto"] = Field(description=AUTO_BOUNDS_DESCRIPTION)
    max_contributions_per_partition: Bound | Literal["auto"] = Field(description=AUTO_BOUNDS_DESCRIPTION)
    auto_budget_share: Annotated[float, Field(gt=0, le=0.5, allow_inf_nan=False)] | None = Field(
        default=None, description="The fraction of the query's ε spent choosing its `auto` bounds, contribution and value "
        "bounds together (default: 0.05 for the shape histograms, 0.1 more where a count or a sum weighs the choice, "
        "0.05 more per column with auto value bounds; at most 0.25).")

    @field_validator("max_partitions_contributed", "max_contributions_per_partition", mode="wrap")
    @classmethod
    def _whole_or_auto(cls, value: object, handler: ValidatorFunctionWrapHandler) -> int | str:
        # One message for a wrong value, the whole number's (a union would add "or 'auto'" to each).
        if isinstance(value, str):
            if value == "auto":
                return value
            raise PydanticCustomError("bound", "must be a whole number or `auto`")
        try:
            return _BOUND.validate_python(value, strict=True)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise PydanticCustomError(first["type"], first["msg"]) from None

    @property
    def has_auto(self) -> bool:
        return "auto" in (self.max_partitions_contributed, self.max_contributions_per_partition)

    def fixed(self) -> tuple[int, int]:
        """(L0, L∞) once neither is `auto` (the planner replaces `auto` before it plans a query)."""
        l0, rows = self.max_partitions_contributed, self.max_contributions_per_partition
        assert isinstance(l0, int) and isinstance(rows, int), "auto bounds are replaced before planning"
        return l0, rows


class Metric(Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    kind: MetricKind
    column: str | None = None
    bounds: tuple[float, float] | Literal["auto"] | None = Field(default=None, description=(
        "[lower, upper]: each value is clamped to them. `auto`: chosen from the data with differential privacy."))
    q: float | list[float] | None = None
    budget_share: PositiveWeight = 1.0
    noise: NoiseChoice | None = None
    clamp: bool = Field(default=False, description="count, privacy_id_count, sum: release within the feasible "
                        "range (counts and sums of non-negative values at least 0), as post-processing.")
    branching: Annotated[int, Field(ge=2, le=256, description=(
        "Quantile tree: children per node. Default: chosen with depth from the bounds and the budget."))] | None = None
    depth: Annotated[int, Field(ge=1, le=10, description=(
        "Quantile tree: levels below the root. Default: chosen with branching from the bounds and the "
        "budget."))] | None = None
    quantile_method: Literal["auto", "tree", "candidates"] = Field(
        default="auto", description="Quantiles: a noisy tree, permute-and-flip over candidate values, or the one "
        "the planner predicts to be more accurate.")
    candidates: Annotated[int, Field(ge=2, le=2**16, description=(
        "Quantile candidates: evenly spaced values from lower to upper bound. Default: every whole number for "
        "an integer column with whole bounds at most 4096 apart, else 1024."))] | None = None
    unit: str | None = Field(default=None, max_length=40, description=(
        "The column's unit (e.g. minutes), used when explain-budget states accuracy in the column's terms."))

    @field_validator("bounds", mode="wrap")
    @classmethod
    def _pair_or_auto(cls, value: object, handler: ValidatorFunctionWrapHandler) -> object:
        # One message for a wrong value (a union would list one per member); YAML and JSON give a
        # list, the model keeps an immutable pair.
        if value == "auto" or value is None:
            return value
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise PydanticCustomError("bounds", "must be `[lower, upper]` (two numbers, both required) or `auto`")
        try:
            return _PAIR.validate_python(tuple(value), strict=True)
        except ValidationError as exc:
            first = exc.errors()[0]
            which = ("lower", "upper")[int(first["loc"][0])]
            raise PydanticCustomError(first["type"], f"the {which} bound: {first['msg']}") from None

    @field_validator("bounds")
    @classmethod
    def _finite_ordered(cls, value: tuple[float, float] | str | None) -> tuple[float, float] | str | None:
        if value is None or isinstance(value, str):
            return value
        lower, upper = value
        if not (math.isfinite(lower) and math.isfinite(upper)):
            raise ValueError("bounds must be finite numbers")
        if not lower < upper:
            raise ValueError(f"lower bound {lower} must be smaller than upper bound {upper}")
        # Fixed-point units are powers of two of the bounds' size; keep them inside float64's range.
        if max(abs(lower), abs(upper)) > BOUND_LIMIT or upper - lower < 1 / BOUND_LIMIT:
            raise ValueError(f"bounds must lie within ±{BOUND_LIMIT:g} and be at least {1 / BOUND_LIMIT:g} apart")
        return value

    def fixed_bounds(self) -> tuple[float, float] | None:
        """The bounds once they are not `auto` (the planner replaces `auto` before it plans a query)."""
        assert self.bounds != "auto", "auto value bounds are replaced before planning"
        return self.bounds

    @field_validator("q")
    @classmethod
    def _quantile_levels(cls, value: float | list[float] | None) -> float | list[float] | None:
        levels = value if isinstance(value, list) else [value] if value is not None else []
        if isinstance(value, list) and not value:
            raise ValueError("q needs at least one level")
        for level in levels:
            if not (0.0 <= level <= 1.0):
                raise ValueError(f"quantile level {level} is not in [0, 1]")
        return value

    @model_validator(mode="after")
    def _needs(self) -> Metric:
        if self.kind in KINDS_WITH_VALUES:
            if self.column is None:
                raise ValueError(f"a `{self.kind}` metric needs `column`")
            if self.bounds is None:
                raise ValueError(f"a `{self.kind}` metric needs `bounds: [lower, upper]`")
        if self.kind == "privacy_id_count" and self.column is not None:
            raise ValueError("a `privacy_id_count` metric takes no `column`")
        if self.kind == "quantile" and self.q is None:
            raise ValueError("a `quantile` metric needs `q`: a level in [0, 1] or a list of them")
        if self.kind != "quantile" and self.q is not None:
            raise ValueError(f"`q` is only for `quantile` metrics, not `{self.kind}`")
        if self.clamp and self.kind not in CLAMPABLE_KINDS:
            raise ValueError(f"`clamp` is for count, privacy_id_count and sum metrics; a `{self.kind}` is always "
                             "released within its bounds")
        tree_set = {"branching", "depth", "quantile_method", "candidates"} & self.model_fields_set
        if tree_set and self.kind not in QUANTILE_KINDS:
            raise ValueError(f"`{sorted(tree_set)[0]}` is only for quantile, median, min and max metrics")
        if self.quantile_method == "candidates" and {"branching", "depth"} & self.model_fields_set:
            raise ValueError("`branching` and `depth` shape a quantile tree, not `quantile_method: candidates`")
        if self.quantile_method == "tree" and "candidates" in self.model_fields_set:
            raise ValueError("`candidates` is for `quantile_method: candidates` (or auto), not a tree")
        if self.quantile_method == "candidates" and self.noise is not None:
            raise ValueError("`noise` is for a quantile tree; candidates are chosen by permute-and-flip, without noise")
        if self.branching is not None and self.depth is not None and self.branching**self.depth > 2**40:
            raise ValueError("branching**depth must be at most 2**40 leaves")
        return self


class Output(Strict):
    path: PathText
    format: Literal["parquet", "csv"] | None = None
    overwrite: bool = False


class Join(Strict):
    """A private input joined with public lookup tables, or with other private inputs on the privacy unit."""

    join: list[str] = Field(min_length=2, description=(
        "The private input first, then the inputs joined to it in order: public lookups, or private inputs."))
    on: str | Annotated[list[str], Field(min_length=1)] | dict[str, str | Annotated[list[str], Field(min_length=1)]] \
        = Field(description=("The column(s) every input joins on; or, per input after the first, the column(s) it "
                             "joins on (columns of the inputs before it)."))
    how: Literal["inner", "left"] = Field(default="inner", description=(
        "inner: a row whose key a joined input lacks is dropped; left: it is kept, with nulls for that input's "
        "columns."))
    max_rows_per_unit: dict[str, Annotated[int, Field(ge=1, le=10**6)]] = Field(default_factory=dict, description=(
        "A join of private inputs: per private input, the rows each privacy unit keeps before the join "
        "(a keyed random choice). Required for every private input after the first; optional for the first."))

    def on_columns(self, name: str) -> list[str]:
        """The columns input `name` (one after the first) joins on."""
        on = self.on.get(name, []) if isinstance(self.on, dict) else self.on
        return [on] if isinstance(on, str) else list(on)


class OrderBy(Strict):
    column: str = Field(min_length=1, description="A released column (a group_by column or a metric), or an "
                        "expression of them.")
    descending: bool = False


class PostProcess(Strict):
    """What a query written in SQL asks of its released table, after the noise: post-processing,
    which spends no budget (HAVING, ORDER BY, LIMIT)."""

    having: str | None = Field(default=None, description="Keep the released rows where this expression, of "
                               "released columns, holds.")
    order_by: list[OrderBy] = Field(default_factory=list)
    limit: Annotated[int, Field(ge=0)] | None = None


class Query(Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    sql: str | None = Field(default=None, description=(
        "The query as one SELECT statement; dprun fills `input`, `derive`, `filter`, `group_by`, `metrics` and "
        "`postprocess` from it (docs/spec.md, Queries in SQL)."))
    input: str | Join
    derive: dict[ColumnName, str] = Field(
        default_factory=dict, description="New columns for this query, each a row-wise Polars SQL expression.")
    filter: str | None = Field(default=None, description="Row filter, a Polars SQL expression.")
    group_by: list[str] = Field(default_factory=list)
    partitions: Partitions | None = None
    contribution_bounds: ContributionBounds
    metrics: list[Metric] = Field(min_length=1)
    budget_share: PositiveWeight = 1.0
    noise: NoiseChoice = "auto"
    output: Output
    postprocess: PostProcess | None = None

    @property
    def has_auto(self) -> bool:
        """Some contribution or value bound is `auto`."""
        return self.contribution_bounds.has_auto or any(m.bounds == "auto" for m in self.metrics)

    @property
    def input_name(self) -> str:
        """The input's name, or for a join its inputs' names joined by `+`."""
        return self.input if isinstance(self.input, str) else "+".join(self.input.join)

    @property
    def private_input(self) -> str:
        return self.input if isinstance(self.input, str) else self.input.join[0]


class SqlQuery(Strict):
    """A query as written in SQL, before `sql_query` compiles it into a `Query` (the JSON Schema's
    second form of a query; the statement itself is checked by the compiler)."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    sql: str = Field(description="One SELECT statement: docs/spec.md, Queries in SQL.")
    bounds: dict[str, tuple[float, float] | Literal["auto"]] = Field(
        default_factory=dict, description="Per aggregated column: [lower, upper] or auto.")
    metric_options: dict[str, dict[str, Scalar]] = Field(
        default_factory=dict, description="Per output column of an aggregate: budget_share, noise, clamp, "
        "quantile_method, candidates, branching, depth, unit.")
    max_rows_per_unit: dict[str, Annotated[int, Field(ge=1, le=10**6)]] = Field(
        default_factory=dict, description="A join of private inputs: rows each unit keeps of each, as in `join`.")
    partitions: Partitions | None = None
    contribution_bounds: ContributionBounds
    budget_share: PositiveWeight = 1.0
    noise: NoiseChoice = "auto"
    output: Output


class Spec(Strict):
    version: Literal[1]
    name: str | None = None
    privacy_unit: str | Annotated[list[str], Field(min_length=1)]
    budget: Budget
    inputs: dict[str, InputSpec] = Field(min_length=1)
    queries: list[Query] = Field(min_length=1)
    report: PathText = Field(default="report.json", description="The accounting report; Markdown is written beside it.")
    dataset: str | None = Field(default=None, description="A stable id of the dataset, for the ledger.")
    ledger: PathText | None = Field(default=None, description=(
        "Release ledger that records and checks releases: a file (an SQLite database, relative to the spec) "
        "or a postgresql:// URL without a password."))

    @field_validator("version", mode="before")
    @classmethod
    def _not_a_boolean(cls, value: object) -> object:
        # `True == 1` in Python, so Literal[1] alone would accept `version: true`.
        if isinstance(value, bool):
            raise ValueError("version must be the number 1")
        return value

    @property
    def privacy_unit_columns(self) -> list[str]:
        return [self.privacy_unit] if isinstance(self.privacy_unit, str) else list(self.privacy_unit)
