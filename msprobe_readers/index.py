"""The records' statistics as a Parquet dataset, so that any query engine reads a dump without parsing JSON.

``msprobe-dump index DUMP`` writes one Parquet file per step/rank directory under
``DUMP/.msprobe/index/v{SCHEMA_VERSION}/attempt={a}/step={s}/rank={r}/`` (hive partitions; ``rank=-1`` for a
``proc{pid}`` directory). A file is rewritten only when its directory's record files changed, so indexing again
after a job reads only what is new. ``msprobe-dump sql DUMP "SELECT ..."`` runs DuckDB over it, with the
dataset as the view ``records``. Spark, Dask, Trino or DuckDB on another machine read the same files unchanged.

The dataset's schema (``SCHEMA``, version ``SCHEMA_VERSION``) is a contract: one row per tensor leaf of a
record (one row with a null ``arg`` for a record without tensors), in the record's execution order.
pyarrow and duckdb are imported only here, and only when used.
"""

from __future__ import annotations

import gc
import hashlib
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from msprobe_inject.dumpformat import names, paths
from msprobe_readers.reading import ProcDir, discover, iter_proc, iter_stacks, record_files
from msprobe_readers.stats import _num

SCHEMA_VERSION = 1

# The hive partitions (in the directory names, not in the files: engines add them as columns)
PARTITIONS: List[Tuple[str, str, str]] = [
    ("attempt", "int32", "elastic restart attempt"),
    ("step", "int32", "step"),
    ("rank", "int32", "rank; -1 for a proc{pid} directory"),
]
# (column, pyarrow type name, meaning) of the files: with PARTITIONS, the documented contract (README "The index")
COLUMNS: List[Tuple[str, str, str]] = [
    ("root", "string", 'directory relative to the dump path: ".", "attempt1", "duplicate_rank0_host_42"'),
    ("process", "string", '"rank0", "proc4242"'),
    ("position", "int32", "the record's position in the step (execution order)"),
    ("record", "string", 'record name, e.g. "Functional.linear.0.forward"'),
    ("kind", "string", '"api", "module", "debug" (null when the name does not parse)'),
    ("direction", "string", '"forward", "backward", "parameters_grad", "debug"'),
    ("arg", "string", 'argument path of the tensor, e.g. "input_args.0", "output.0"; null: no tensor'),
    ("dtype", "string", 'e.g. "torch.float32"'),
    ("shape", "list<int64>", "tensor shape"),
    ("max", "float64", "Max"),
    ("min", "float64", "Min"),
    ("mean", "float64", "Mean"),
    ("norm", "float64", "Norm"),
    ("md5", "string", "md5/xor summary when the dump has one"),
    ("stack_id", "int32", "position of the record's entry in stack.json; null without one"),
]


def index_root(dump_path: str) -> str:
    return os.path.join(dump_path, paths.META_DIR, paths.INDEX_DIR, f"v{SCHEMA_VERSION}")


def schema() -> Any:
    import pyarrow as pa

    types = {"int32": pa.int32(), "string": pa.string(), "float64": pa.float64(), "list<int64>": pa.list_(pa.int64())}
    return pa.schema([(name, types[kind]) for name, kind, _ in COLUMNS])


def _file_of(dump_path: str, proc: ProcDir) -> str:
    tag = hashlib.sha1(f"{proc.root}/{proc.process}".encode()).hexdigest()[:12]  # duplicates share rank and step
    return paths.index_file(dump_path, SCHEMA_VERSION, proc.attempt, proc.step, proc.rank, proc.process, tag)


def _source_mtime(proc: ProcDir) -> float:
    files = record_files(proc) or [os.path.join(proc.path, paths.JOURNAL)]
    times = [os.stat(f).st_mtime for f in files if os.path.exists(f)]
    return max(times) if times else 0.0


def _stack_ids(proc: ProcDir) -> Dict[str, int]:
    out: Dict[str, int] = {}
    try:
        for i, (records, _) in enumerate(iter_stacks(proc.path)):
            for record in records:
                out.setdefault(record, i)
    except (OSError, ValueError):
        pass
    return out


_PARSED: Dict[str, Tuple[Optional[str], Optional[str]]] = {}  # record name -> (kind, direction): names repeat


def _tensors(value: Any) -> List[Tuple[str, dict]]:
    """``stats.iter_tensors`` of a decoded JSON value, without a generator per level (the index's hot loop)."""
    out: List[Tuple[str, dict]] = []
    stack: List[Tuple[str, Any]] = [("", value)]
    while stack:
        prefix, v = stack.pop()
        if type(v) is dict:
            if "Max" in v or "md5" in v or str(v.get("type", "")).endswith(("Tensor", "ndarray")):
                out.append((prefix, v))
                continue
            items = [(f"{prefix}.{k}" if prefix else str(k), x) for k, x in v.items() if type(x) in (dict, list)]
        elif type(v) is list:
            items = [(f"{prefix}.{i}" if prefix else str(i), x) for i, x in enumerate(v) if type(x) in (dict, list)]
        else:
            continue
        items.reverse()
        stack.extend(items)
    return out


def _kind(name: str) -> Tuple[Optional[str], Optional[str]]:
    known = _PARSED.get(name)
    if known is None:
        parsed = names.parse(name)
        known = (parsed.kind, parsed.direction) if parsed else (None, None)
        if len(_PARSED) > 1_000_000:
            _PARSED.clear()
        _PARSED[name] = known
    return known


def row_tuples(proc: ProcDir) -> Iterator[tuple]:
    """The index rows of one step/rank directory, in execution order, as tuples in ``COLUMNS`` order."""
    stacks = _stack_ids(proc)
    root, process = proc.root, proc.process
    num = _num
    for position, name, value, _ in iter_proc(proc):
        kind, direction = _kind(name)
        stack_id = stacks.get(name)
        found = False
        for path, e in _tensors(value):
            found = True
            shape = e.get("shape")
            md5 = e.get("md5")
            dtype = e.get("dtype")
            yield (root, process, position, name, kind, direction, path, dtype if isinstance(dtype, str) else None,
                   shape if isinstance(shape, list) and shape else None, num(e.get("Max")), num(e.get("Min")),
                   num(e.get("Mean")), num(e.get("Norm")), str(md5) if md5 is not None else None, stack_id)
        if not found:
            yield (root, process, position, name, kind, direction, None, None, None, None, None, None, None, None,
                   stack_id)


def rows(proc: ProcDir) -> Iterator[Dict[str, Any]]:
    """The index rows of one step/rank directory, in execution order, as column -> value."""
    columns = [name for name, _, _ in COLUMNS]
    for row in row_tuples(proc):
        yield dict(zip(columns, row))


BATCH_ROWS = 100_000  # rows per row group: memory stays bounded for a dump.json of any size


def _write(path: str, source: Iterator[tuple]) -> int:
    """Stream row tuples into a new Parquet file at ``path`` (atomically replaced); returns the number of rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from msprobe_inject.dumpformat import files

    files.makedirs(os.path.dirname(path))
    sch = schema()
    names_ = sch.names
    tmp = f"{path}.tmp{os.getpid()}"
    # no min/max statistics for the statistics columns: engines prune row groups with them, and Parquet's
    # statistics leave NaN out, so `WHERE isnan(max)` would skip exactly the rows one looks for
    stats_columns = [name for name, kind, _ in COLUMNS if kind != "float64"]
    total = 0

    def table(batch: List[tuple]) -> Any:
        cols = list(zip(*batch)) if batch else [[] for _ in names_]
        return pa.Table.from_arrays([pa.array(list(c), type=sch.field(i).type) for i, c in enumerate(cols)],
                                    schema=sch)

    with pq.ParquetWriter(tmp, sch, compression="zstd", write_statistics=stats_columns) as writer:
        batch: List[tuple] = []
        for row in source:
            batch.append(row)
            if len(batch) >= BATCH_ROWS:
                total += len(batch)
                writer.write_table(table(batch))
                batch = []
        if batch or not total:
            total += len(batch)
            writer.write_table(table(batch))
    os.chmod(tmp, files.FILE_MODE)
    os.replace(tmp, path)
    return total


def build(dump_path: str, force: bool = False, select: Optional[Callable[[ProcDir], bool]] = None) -> Dict[str, int]:
    """Index every step/rank directory of ``dump_path`` (that ``select`` accepts: a node's launcher indexes its own
    ranks) whose records changed since it was last indexed.
    Returns {"directories": indexed, "skipped": up to date, "rows": rows written}."""
    done = {"directories": 0, "skipped": 0, "rows": 0}
    collecting = gc.isenabled()
    gc.disable()  # the rows are acyclic: collections would only rescan millions of fresh objects (~30% of the time)
    try:
        _build(dump_path, force, select, done)
    finally:
        if collecting:
            gc.enable()
    return done


def _build(dump_path: str, force: bool, select: Optional[Callable[[ProcDir], bool]], done: Dict[str, int]) -> None:
    for proc in discover(dump_path):
        if proc.file or (select is not None and not select(proc)):
            continue
        target = _file_of(dump_path, proc)
        if not force and os.path.exists(target) and os.stat(target).st_mtime >= _source_mtime(proc):
            done["skipped"] += 1
            continue
        done["rows"] += _write(target, row_tuples(proc))
        done["directories"] += 1


def exists(dump_path: str) -> bool:
    return os.path.isdir(index_root(dump_path))


def connect(dump_path: str) -> Any:
    """A DuckDB connection with the view ``records`` over the dump's index."""
    import duckdb

    con = duckdb.connect()
    pattern = os.path.join(index_root(dump_path), "**", "*.parquet").replace("'", "''")
    types = ", ".join(f"'{name}': INTEGER" for name, _, _ in PARTITIONS)
    con.execute(f"CREATE VIEW records AS SELECT * FROM read_parquet('{pattern}', hive_partitioning = true, "
                f"hive_types = {{{types}}})")
    return con


def query(dump_path: str, sql: str) -> Tuple[List[str], List[tuple]]:
    """(column names, rows) of ``sql`` over the view ``records``."""
    con = connect(dump_path)
    try:
        cur = con.execute(sql)
        return [d[0] for d in cur.description or []], cur.fetchall()
    finally:
        con.close()


def format_rows(columns: List[str], result: List[tuple], limit: Optional[int] = None) -> str:
    """Tab-separated, with a header line."""
    lines = ["\t".join(columns)]
    for row in result[:limit] if limit else result:
        lines.append("\t".join("" if v is None else str(v) for v in row))
    return "\n".join(lines)
