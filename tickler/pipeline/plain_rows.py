"""The import's row checks as Spark SQL expressions: rows the executors' JVM can vouch for.

Most rows of an import are plain: a queue that exists, keys of printable ASCII, an RFC 3339 time
in the usual spelling, a flat JSON object with no escapes. For such a row a Spark SQL expression
decides, in the JVM, that the API's rules (pipeline.validate.check_row) accept it, and builds its
line of COPY text for the staging table, so the row never becomes a Python object.

The expressions are deliberately narrower than the rules. A row they do not vouch for (anything
unusual: a key outside printable ASCII, a number with a fraction or an exponent, an escape, a
nested object, a repeated key, a field that breaks a rule...) goes to check_row in Python, which
decides it and spells its reason. So every rejection, its message and its row number still come
from one place, and the expressions need only never vouch for a row that check_row refuses
(tests/test_pipeline_import.py holds them to that on the awkward cases).

Column handling is table-driven: a new import column (in validate.FIELDS and import_copy) goes
by the Python path for every row until PLAIN_WHEN_GIVEN has an expression for it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import UTC, datetime, timedelta

from pyspark.sql import Column
from pyspark.sql import functions as F

from tickler.pipeline.validate import FIELDS
from tickler.scheduler import rules

# The lines the importer's Python receives: a COPY line for a vouched row, the row's JSON otherwise.
PLAIN, CHECK = "P", "C"

# rules._PLAIN_KEY: printable ASCII but '/' and space, 1-255 characters.
_PLAIN_KEY = rf"^[!-.0-~]{{1,{rules.MAX_KEY_LENGTH}}}$"
# RFC 3339 as the API spells it most often (upper-case T and Z, at most microseconds), with the
# ranges of each part: what is left (30 February) is for try_to_timestamp to refuse.
_TIMESTAMP = (
    r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
    r"(\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"
)
# Whole seconds up to 999,999,999 (MAX_DELAY_SECONDS is 3.16e9); float() and float8 read them alike.
_DELAY = r"^[0-9]{1,9}$"
_MAX_ATTEMPTS = rf"^([1-9][0-9]{{0,{len(str(rules.MAX_ATTEMPTS_LIMIT)) - 2}}}|{rules.MAX_ATTEMPTS_LIMIT})$"
# -100..100 (SPEC §10), written plainly: no sign on 0, no leading zeros.
_PRIORITY = r"^(0|-?[1-9][0-9]?|-?100)$"
# One flat object: a single pair of braces, no backslash (so no escapes: the raw text is what
# jsonb stores and what the size rule measures, at least), no control character at all.
_FLAT_OBJECT = r"^ *\{[^{}\\\x00-\x1F]*\} *$"
# What the JVM's JSON reader would pass and Python's strict reader might not, or what Python
# would store differently from jsonb: a fraction or exponent (Python stores 1.10 as 1.1), NaN and
# Infinity, leading zeros, a value starting with '+', '.' or a lone '-', a single-quoted token
# (Spark's reader allows them), integers longer than Python converts.
_UNSURE_DATA = r"[0-9][.eE]|NaN|Infinity|(^|[^0-9])0[0-9]|[{,:\[] *['+.]|-[^0-9]|[0-9]{300}"
_UNADDRESSABLE = list(rules.UNADDRESSABLE_KEYS)
# A version-00 traceparent as TraceContext.parse keeps it unchanged (lower case, nothing around it)
# and with ids that are not all zeros; anything else is for check_row (which drops a malformed one).
_TRACEPARENT = r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"
_ZERO_IDS = r"^00-(0{32}-|[0-9a-f]{32}-0{16}-)"


def given(name: str) -> Column:
    """The cell has a value (empty is "not given", as in check_row)."""
    return F.col(name).isNotNull() & (F.col(name) != "")


def _plain_data(max_data_bytes: int) -> Column:
    data = F.col("data")
    keys = F.json_object_keys(data)  # null unless one valid JSON object
    return (
        data.rlike(_FLAT_OBJECT)
        & ~data.rlike(_UNSURE_DATA)
        & (F.octet_length(data) <= max_data_bytes)
        & keys.isNotNull()
        & (F.size(keys) == F.size(F.array_distinct(keys)))
    )


def _plain_schedule_on(now: datetime) -> Column:
    text = F.col("schedule_on")
    when = F.try_to_timestamp(text)
    # a margin under MAX_SCHEDULE_AHEAD: `now` here is the driver's, check_row's the executor's
    latest = now + rules.MAX_SCHEDULE_AHEAD - timedelta(days=1)
    return (
        text.rlike(_TIMESTAMP)
        & when.isNotNull()
        & (when >= F.lit(datetime(1970, 1, 1, tzinfo=UTC)))
        & (when <= F.lit(latest))
    )


# field -> what a given cell must be for the JVM to vouch for it ("must be given" is separate)
PLAIN_WHEN_GIVEN: dict[str, Callable[[Collection[str], int, datetime], Column]] = {
    "queue": lambda queues, _bytes, _now: F.col("queue").isin(sorted(queues)),
    "item_key": lambda _q, _bytes, _now: F.col("item_key").rlike(_PLAIN_KEY) & ~F.col("item_key").isin(_UNADDRESSABLE),
    "group_key": lambda _q, _bytes, _now: F.col("group_key").rlike(_PLAIN_KEY),
    "schedule_on": lambda _q, _bytes, now: _plain_schedule_on(now),
    "delay_seconds": lambda _q, _bytes, _now: F.col("delay_seconds").rlike(_DELAY),
    "data": lambda _q, max_bytes, _now: _plain_data(max_bytes),
    "max_attempts": lambda _q, _bytes, _now: F.col("max_attempts").rlike(_MAX_ATTEMPTS),
    "priority": lambda _q, _bytes, _now: F.col("priority").rlike(_PRIORITY),
    "fairness_key": lambda _q, _bytes, _now: (
        F.col("fairness_key").rlike(_PLAIN_KEY) & ~F.col("fairness_key").isin(_UNADDRESSABLE)
    ),
    "traceparent": lambda _q, _bytes, _now: (
        F.col("traceparent").rlike(_TRACEPARENT) & ~F.col("traceparent").rlike(_ZERO_IDS)
    ),
}
REQUIRED = ("queue", "item_key", "data")


def plain(queues: Collection[str], max_data_bytes: int, now: datetime) -> Column:
    """True for a row check_row accepts as it is, and the first row of its key; false otherwise
    (the row then goes to check_row). Never null."""
    vouched = F.col("row") == F.col("first_row")
    for field in FIELDS:
        if field not in PLAIN_WHEN_GIVEN:
            return F.lit(False)  # a column with no expression yet: Python decides every row
        cell = PLAIN_WHEN_GIVEN[field](queues, max_data_bytes, now)
        vouched &= (given(field) & cell) if field in REQUIRED else (~given(field) | cell)
    vouched &= ~(given("schedule_on") & given("delay_seconds"))  # "Give schedule_on or delay_seconds, not both."
    return F.coalesce(vouched, F.lit(False))


def _copy_text(name: str) -> Column:
    """A cell as COPY's text format has it: \\N for "not given", backslash doubled (the key rule
    allows a backslash; tabs and newlines cannot be in a vouched cell)."""
    return F.when(given(name), F.regexp_replace(F.col(name), r"\\", r"\\\\")).otherwise(F.lit("\\N"))


# The staging table's columns after `ord`, in the order of pipeline/queries.sql's import_copy,
# which lists FIELDS in their order (check_row's values come in that order too).
COPY_TEXT = FIELDS


def line(queues: Collection[str], max_data_bytes: int, now: datetime) -> Column:
    """Each row as one line for the loader: "P" and its COPY text when vouched for, else "C" and its JSON."""
    copy_line = F.concat_ws("\t", F.col("row").cast("string"), *[_copy_text(f) for f in COPY_TEXT])
    as_json = F.to_json(F.struct("row", "first_row", *FIELDS))
    return F.when(plain(queues, max_data_bytes, now), F.concat(F.lit(PLAIN), copy_line)).otherwise(
        F.concat(F.lit(CHECK), as_json)
    )
