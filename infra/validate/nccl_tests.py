"""Read the result tables nccl-tests print (github.com/NVIDIA/nccl-tests): bus bandwidth per size, peak, the
"# Avg bus bandwidth" line, the #wrong column and "# Out of bounds values".

Formats, src/util.cu (v2.19.6) and src/common.cu (v2.0.0 .. v2.17.x):
  row: "%12li  %12li  %8s  %6s  %6i" size, count, type, redop, root (no root column before v2.10), then per
       out-of-place and in-place "time algbw busbw #wrong" ("error", a max delta, before v2.13), with
       "i_min i_max i_p99 i_cv%" after each group when per-iteration timing is on, "N/A" when not checked;
  "# Avg bus bandwidth    : %g [OK|FAILED]", "# Out of bounds values : %d OK|FAILED",
  "#  Rank %2d Group %2d Pid %6d on %10s device %2d ...", "# Collective test starting: all_reduce_perf".
busbw is the algorithm bandwidth times the collective's factor, 2(n-1)/n for all_reduce, in GB/s = 10**9
bytes/s (doc/PERFORMANCE.md, src/all_reduce.cu AllReduceGetBw).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

# test_typenames / test_opnames of src/common.cu (v2.0.0 .. v2.19.6)
_TYPES = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16"}
_TYPES |= {"f8e4m3", "f8e5m2"}
_OPS = {"sum", "prod", "max", "min", "avg", "mulsum", "none"}

# Launcher labels around a row: mpirun --tag-output "[1,0]<stdout>:", per-rank "[0]", srun --label "0:".
_LABELS = re.compile(r"\[\d+(?:,\d+)*\](?:<std(?:out|err)>:)?|^\s*\d+:\s")
_HEADER = re.compile(
    r"^#\s+size\s+count\s+type\s+redop\s+(?P<root>root\s+)?(?:cpu)?time\s+algbw\s+busbw\s+(?P<err>\S+)"
)
_ROW_START = re.compile(
    r"^\s*(?P<size>\d+)\s+(?P<count>\d+)\s+(?P<type>[a-z0-9]+)\s+(?P<op>[a-z]+)\s+(?P<rest>.*)$"
)
_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*(?P<value>[-+.\deE]+)")
_OUT_OF_BOUNDS = re.compile(r"#\s*Out of bounds values\s*:\s*(?P<value>\d+)")
_RANK = re.compile(
    r"#\s+Rank\s+(?P<rank>\d+)\s+(?:Group\s+\d+\s+)?(?:Pid\s+\d+\s+)?on\s+(?P<host>\S+)\s+device"
)
_TEST = re.compile(r"#\s*Collective test starting:\s*(?P<name>\S+)")

ErrorColumn = Literal["#wrong", "error"]


@dataclass(frozen=True)
class Measurement:
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: int | None  # elements wrong; None where "N/A" or where the column is the old max delta ("error")


@dataclass(frozen=True)
class ResultRow:
    size_bytes: int
    count: int
    dtype: str
    redop: str
    out_of_place: Measurement | None
    in_place: Measurement | None

    @property
    def best_busbw_gbps(self) -> float:
        return max(m.busbw_gbps for m in (self.out_of_place, self.in_place) if m is not None)

    def busbw(self, column: Literal["in-place", "out-of-place"]) -> float | None:
        measurement = self.in_place if column == "in-place" else self.out_of_place
        return None if measurement is None else measurement.busbw_gbps


@dataclass
class ResultsTable:
    test: str | None = None
    error_column: ErrorColumn | None = None
    rows: list[ResultRow] = field(default_factory=list)
    avg_busbw_gbps: float | None = None
    out_of_bounds: int | None = None
    rank_hosts: dict[int, str] = field(default_factory=dict)

    @property
    def peak(self) -> ResultRow | None:
        return max(self.rows, key=lambda row: row.best_busbw_gbps, default=None)

    @property
    def wrong_elements(self) -> int:
        return sum(m.wrong or 0 for row in self.rows for m in (row.out_of_place, row.in_place) if m)

    @property
    def nodes(self) -> int | None:
        return len(set(self.rank_hosts.values())) or None

    @property
    def is_all_reduce(self) -> bool | None:
        """all_reduce_perf by test name; without one, reduction rows may also be reduce or reduce_scatter."""
        if self.test is not None:
            return self.test.startswith("all_reduce")
        return None if any(row.redop != "none" for row in self.rows) else False

    def row_at(self, size_bytes: int) -> ResultRow | None:
        return next((row for row in self.rows if row.size_bytes == size_bytes), None)


@dataclass
class _Layout:
    root: bool | None = None
    per_iteration: bool = False
    error_column: ErrorColumn | None = None


def parse_results(text: str) -> list[ResultsTable]:
    """Every result table in the text; a new table starts at a header or where the size stops growing."""
    tables: list[ResultsTable] = []
    current = ResultsTable()
    layout = _Layout()
    pending_hosts: dict[int, str] = {}
    pending_test: str | None = None
    for raw in text.splitlines():
        line = _LABELS.sub(" ", raw).strip()
        if match := _RANK.search(line):
            pending_hosts[int(match["rank"])] = match["host"]
        elif match := _TEST.search(line):
            pending_test = match["name"]
        elif match := _HEADER.match(line):
            layout = _Layout(
                bool(match["root"]), "i_min" in line, "#wrong" if match["err"] == "#wrong" else "error"
            )
            current = _start(tables, current)
        elif match := _AVG.search(line):
            current.avg_busbw_gbps = float(match["value"])
        elif match := _OUT_OF_BOUNDS.search(line):
            current.out_of_bounds = int(match["value"])
        elif row := _row(line, layout):
            if (
                current.rows and row.size_bytes <= current.rows[-1].size_bytes
            ) or current.avg_busbw_gbps is not None:
                current = _start(tables, current)
            if not current.rows:
                current.test, current.rank_hosts = pending_test, dict(pending_hosts)
                current.error_column = layout.error_column
            current.rows.append(row)
    _start(tables, current)
    return tables


def _start(tables: list[ResultsTable], current: ResultsTable) -> ResultsTable:
    if current.rows:
        tables.append(current)
        return ResultsTable()
    return current


def _row(line: str, layout: _Layout) -> ResultRow | None:
    match = _ROW_START.match(line)
    if not match or match["type"] not in _TYPES or match["op"] not in _OPS:
        return None
    values = match["rest"].split()
    has_root = layout.root if layout.root is not None else (len(values) % 2 == 1 or values[:1] == ["-1"])
    values = values[1:] if has_root else values
    width = 8 if layout.per_iteration else 4
    groups = [values[i : i + width] for i in range(0, len(values) - width + 1, width)][:2]
    try:
        measurements = [_measurement(group, layout.error_column) for group in groups]
    except ValueError:
        return None
    if not measurements:
        return None
    out_of_place, in_place = (None, measurements[0]) if len(measurements) == 1 else measurements
    return ResultRow(
        int(match["size"]), int(match["count"]), match["type"], match["op"], out_of_place, in_place
    )


def _measurement(group: list[str], error_column: ErrorColumn | None) -> Measurement:
    time, algbw, busbw, wrong = group[:4]
    wrong_count = None if wrong == "N/A" or error_column == "error" else int(float(wrong))
    if error_column is None and wrong != "N/A" and not float(wrong).is_integer():
        wrong_count = None  # a max delta ("error" column) seen without its header
    return Measurement(float(time), float(algbw), float(busbw), wrong_count)
