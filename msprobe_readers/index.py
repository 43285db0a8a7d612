"""The records' statistics as a Parquet dataset, so that any query engine reads a dump without parsing JSON.

``msprobe-dump index DUMP`` writes one Parquet file per step/rank directory under
``DUMP/.msprobe/index/v{SCHEMA_VERSION}/attempt={a}/step={s}/rank={r}/`` (hive partitions; ``rank=-1`` for a
``proc{pid}`` directory). A file is rewritten only when its directory's record files changed, so indexing again
after a job reads only what is new. ``msprobe-dump sql DUMP "SELECT ..."`` runs DuckDB over it, with the
dataset as the view ``records``. Spark, Dask, Trino or DuckDB on another machine read the same files unchanged.

The dataset's schema (``SCHEMA``, version ``SCHEMA_VERSION``) is a contract: one row per tensor leaf of a
record (one row with a null ``arg`` for a record without tensors), in the record's execution order.
pyarrow and duckdb are imported only here, and only when used.

``row_tuples`` is the definition of the rows. When a directory's records are one dump.json, the optional C
extension ``_jrows`` (built with the package when a C compiler is there) makes the same rows column-wise,
without a Python object per JSON value; on anything it does not decide exactly as ``row_tuples`` would (a
damaged file, a value it leaves to Python), the directory is indexed by ``row_tuples`` instead.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import mmap
import os
import sys
from array import array
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from msprobe_inject.dumpformat import names, paths
from msprobe_readers.reading import ProcDir, discover, iter_proc, iter_stacks, record_files
from msprobe_readers.stats import Leaf, _num
from msprobe_readers.stats import _is_tensor as is_tensor
from msprobe_readers.stats import _mesh as stat_mesh
from msprobe_readers.stats import _placements as stat_placements

try:  # a dump.json's rows column-wise in one C pass (see _jrows.c); without a C compiler, row_tuples alone
    from msprobe_readers import _jrows
except ImportError:  # pragma: no cover
    _jrows = None  # type: ignore[assignment]

SCHEMA_VERSION = 2  # 2: data_name, placements, device_mesh, error; [] for a 0-d shape; the file metadata

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
    ("shape", "list<int64>", "tensor shape ([] for a 0-d tensor; null when the dump has none)"),
    ("max", "float64", "Max"),
    ("min", "float64", "Min"),
    ("mean", "float64", "Mean"),
    ("norm", "float64", "Norm"),
    ("md5", "string", "md5/xor summary when the dump has one"),
    ("stack_id", "int32", "position of the record's entry in stack.json; null without one"),
    ("data_name", "string", "the tensor's file under dump_tensor_data (tensor task)"),
    ("placements", "string", "a DTensor's placements, the JSON text of dump.json's list"),
    ("device_mesh", "string", "a DTensor's device mesh, the JSON text of dump.json's nested list"),
    ("error", "string", "why the statistics are missing, when the dump says"),
]
# Each file's key-value metadata under META_KEY (JSON): "sources", {record file: [mtime_ns, size]} as read;
# "header", dump.json's fields other than data; "errors", [[record file, message]] of what could not be read;
# "records", their number. With them the readers answer from a file exactly as from the JSON it was built from,
# and know when it is out of date.
META_KEY = b"msprobe"


def index_root(dump_path: str) -> str:
    return os.path.join(dump_path, paths.META_DIR, paths.INDEX_DIR, f"v{SCHEMA_VERSION}")


def schema() -> Any:
    import pyarrow as pa

    types = {"int32": pa.int32(), "string": pa.string(), "float64": pa.float64(), "list<int64>": pa.list_(pa.int64())}
    return pa.schema([(name, types[kind]) for name, kind, _ in COLUMNS])


def _file_of(dump_path: str, proc: ProcDir) -> str:
    tag = hashlib.sha1(f"{proc.root}/{proc.process}".encode()).hexdigest()[:12]  # duplicates share rank and step
    return paths.index_file(dump_path, SCHEMA_VERSION, proc.attempt, proc.step, proc.rank, proc.process, tag)


def _sources(proc: ProcDir) -> Dict[str, List[int]]:
    """{file name: [mtime_ns, size]} of what a directory's index file is built from; {} when there is nothing."""
    out: Dict[str, List[int]] = {}
    files = record_files(proc) or [os.path.join(proc.path, paths.JOURNAL)]
    for f in files + [os.path.join(proc.path, paths.STACK_JSON)]:
        try:
            st = os.stat(f)
        except OSError:
            continue
        out[os.path.basename(f)] = [st.st_mtime_ns, st.st_size]
    return out if len(out) > (paths.STACK_JSON in out) else {}


def _meta(file: str) -> Optional[Dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        raw = (pq.read_metadata(file).metadata or {}).get(META_KEY)
        return json.loads(raw) if raw else None
    except (OSError, ValueError):
        return None


def fresh_file(proc: ProcDir) -> Optional[Tuple[str, Dict[str, Any]]]:
    """(index file, its metadata) of a step/rank directory when the file was built from the directory's record
    files as they are now; else None (no index, out of date, or a file named directly)."""
    if not proc.dump or proc.file:
        return None
    target = _file_of(proc.dump, proc)
    meta = _meta(target) if os.path.exists(target) else None
    return fresh_in(proc, {os.path.normpath(target): meta}) if meta is not None else None


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
            if is_tensor(v):
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


def _json_text(value: Any) -> Optional[str]:
    return json.dumps(value, separators=(",", ":")) if isinstance(value, list) else None


def row_tuples(proc: ProcDir, header: Optional[Dict[str, Any]] = None,
               errors: Optional[List[Tuple[str, str]]] = None) -> Iterator[tuple]:
    """The index rows of one step/rank directory, in execution order, as tuples in ``COLUMNS`` order; dump.json's
    header fields go into ``header`` and what could not be read into ``errors`` (file name, message)."""
    stacks = _stack_ids(proc)
    root, process = proc.root, proc.process
    num = _num

    def failed(file: str, exc: Exception) -> None:
        if errors is not None:
            errors.append((os.path.relpath(file, proc.path), str(exc)))

    for position, name, value, _ in iter_proc(proc, failed, header, indexed=False):
        kind, direction = _kind(name)
        stack_id = stacks.get(name)
        found = False
        for path, e in _tensors(value):
            found = True
            shape = e.get("shape")
            md5 = e.get("md5")
            dtype = e.get("dtype")
            data_name = e.get("data_name")
            error = e.get("error")
            yield (root, process, position, name, kind, direction, path, dtype if isinstance(dtype, str) else None,
                   shape if isinstance(shape, list) else None, num(e.get("Max")), num(e.get("Min")),
                   num(e.get("Mean")), num(e.get("Norm")), str(md5) if md5 is not None else None, stack_id,
                   data_name if isinstance(data_name, str) else None, _json_text(e.get("placements")),
                   _json_text(e.get("device_mesh")), error if isinstance(error, str) else None)
        if not found:
            yield (root, process, position, name, kind, direction, None, None, None, None, None, None, None, None,
                   stack_id, None, None, None, None)


def rows(proc: ProcDir) -> Iterator[Dict[str, Any]]:
    """The index rows of one step/rank directory, in execution order, as column -> value."""
    columns = [name for name, _, _ in COLUMNS]
    for row in row_tuples(proc):
        yield dict(zip(columns, row))


BATCH_ROWS = 100_000  # rows per row group: memory stays bounded for a dump.json of any size


def _write(path: str, source: Iterator[tuple], meta: Optional[Dict[str, Any]] = None) -> int:
    """Stream row tuples into a new Parquet file at ``path`` (atomically replaced), with ``meta`` (as it is once the
    rows are written: reading them fills it) as its ``META_KEY`` metadata; returns the number of rows."""
    import pyarrow as pa

    sch = schema()
    names_ = sch.names

    def table(batch: List[tuple]) -> Any:
        cols = list(zip(*batch)) if batch else [[] for _ in names_]
        return pa.Table.from_arrays([pa.array(list(c), type=sch.field(i).type) for i, c in enumerate(cols)],
                                    schema=sch)

    def tables() -> Iterator[Any]:
        batch: List[tuple] = []
        for row in source:
            batch.append(row)
            if len(batch) >= BATCH_ROWS:
                yield table(batch)
                batch = []
        if batch:
            yield table(batch)

    return _write_tables(path, tables(), meta)


def _write_tables(path: str, tables: Iterator[Any], meta: Optional[Dict[str, Any]] = None) -> int:
    """``_write`` of rows given as pyarrow tables of ``schema()``: the file has one row group per ``BATCH_ROWS``
    rows however the tables are cut. Nothing is left behind when ``tables`` raises."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from msprobe_inject.dumpformat import files

    files.makedirs(os.path.dirname(path))
    sch = schema()
    # no min/max statistics for the statistics columns: engines prune row groups with them, and Parquet's
    # statistics leave NaN out, so `WHERE isnan(max)` would skip exactly the rows one looks for
    stats_columns = [name for name, kind, _ in COLUMNS if kind != "float64"]
    total = 0
    # files.atomic_file: created 0640 without following a symlink, renamed over path only when complete
    with files.atomic_file(path) as fh, \
            pq.ParquetWriter(fh, sch, compression="zstd", write_statistics=stats_columns) as writer:
        pending: List[Any] = []
        held = 0
        for t in tables:
            if not t.num_rows:
                continue
            pending.append(t)
            held += t.num_rows
            while held >= BATCH_ROWS:
                whole = pa.concat_tables(pending)
                writer.write_table(whole.slice(0, BATCH_ROWS))
                total += BATCH_ROWS
                rest = whole.slice(BATCH_ROWS)
                pending, held = ([rest] if rest.num_rows else []), rest.num_rows
        if pending or not total:
            writer.write_table(pa.concat_tables(pending) if pending else sch.empty_table())
            total += held
        if meta is not None:
            writer.add_key_value_metadata({META_KEY: json.dumps(meta, allow_nan=True).encode()})
    return total


def _scannable(proc: ProcDir) -> Optional[str]:
    """The dump.json whose bytes alone give a directory's records (``iter_proc`` reads it and nothing else), when
    the C extension is there to scan it; else None."""
    if _jrows is None:
        return None
    found = record_files(proc)
    return found[0] if len(found) == 1 and os.path.basename(found[0]) == paths.DUMP_JSON else None


def _scanned(proc: ProcDir, file: str, meta: Dict[str, Any]) -> Iterator[Any]:
    """``row_tuples``' rows of a directory whose records are the one dump.json ``file``, as tables of ``schema()``,
    from the C scanner; ``meta``'s header and record count filled as ``_build`` fills them. Raises ValueError
    (``_jrows.Unhandled``: a damaged file, a value left to Python) or OSError before its end on what it leaves to
    ``row_tuples``."""
    stacks = _stack_ids(proc)
    sch = schema()
    kinds: List[Tuple[Optional[str], Optional[str]]] = []  # _kind of each group of record names (see _jrows.c)
    # mapped, not read (the writers replace dump.json, never rewrite it in place); the pages scanned are let go
    # chunk by chunk, as the Python path's memory stays bounded (a span read again later is read from the file)
    drop = getattr(mmap, "MADV_DONTNEED", None)
    with open(file, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        scanner = _jrows.Scanner(mm)
        try:
            while True:
                chunk = scanner.next(BATCH_ROWS)
                if chunk is None:
                    break
                kinds.extend(_kind(name) for name in chunk["new_groups"])
                table = _chunk_table(proc, chunk, mm, stacks, kinds, sch)
                meta["records"] = chunk["first"] + chunk["records"]
                if drop is not None and chunk["end"] >= mmap.PAGESIZE:
                    mm.madvise(drop, 0, chunk["end"] - chunk["end"] % mmap.PAGESIZE)
                yield table
            header = meta["header"]
            for key, start, end in scanner.header():
                header[key] = json.loads(mm[start:end].decode("utf-8"))
        finally:
            scanner.close()  # before the mapping closes: the scanner holds its buffer


def _chunk_table(proc: ProcDir, chunk: Dict[str, Any], mm: Any, stacks: Dict[str, int],
                 kinds: List[Tuple[Optional[str], Optional[str]]], sch: Any) -> Any:
    """A table of ``schema()`` from the columns ``_jrows.Scanner.next`` gives (Arrow buffers as bytes). What
    depends on a record's name alone is computed here as ``row_tuples`` computes it: ``stack_id`` per record,
    kind and direction (``_kind``) once per group of names that ``names.parse`` answers alike (``kinds``, by the
    scanner's group numbers)."""
    import pyarrow as pa

    n, m = chunk["rows"], chunk["records"]
    buf = pa.py_buffer

    def strings(col: Tuple[bytes, bytes, bytes, int], length: int) -> Any:
        valid, offsets, data, nulls = col
        return pa.Array.from_buffers(pa.string(), length, [buf(valid) if nulls else None, buf(offsets), buf(data)],
                                     null_count=nulls)

    def floats(col: Tuple[bytes, bytes, int]) -> Any:
        valid, data, nulls = col
        return pa.Array.from_buffers(pa.float64(), n, [buf(valid) if nulls else None, buf(data)], null_count=nulls)

    def texts(spans: List[Tuple[int, int, int]]) -> Any:  # placements, device_mesh: rare, re-serialised
        if not spans:
            return pa.nulls(n, pa.string())
        out: List[Optional[str]] = [None] * n
        for row, start, end in spans:
            out[row] = _json_text(json.loads(mm[start:end].decode("utf-8")))
        return pa.array(out, pa.string())

    names_ = strings(chunk["names"], m)
    record = pa.Array.from_buffers(pa.int32(), n, [None, buf(chunk["record"])])  # row -> record in the chunk
    group = pa.Array.from_buffers(pa.int32(), m, [None, buf(chunk["group"])]).take(record)  # row -> its group
    present = [kinds[g] for g in array("i", chunk["groups"])]  # the chunk's groups, as "group" numbers them
    stack_ids = [stacks.get(name) for name in names_.to_pylist()] if stacks else None
    valid, offsets, values, nulls, count = chunk["shape"]
    shape = pa.Array.from_buffers(pa.list_(pa.int64()), n, [buf(valid) if nulls else None, buf(offsets)],
                                  null_count=nulls,
                                  children=[pa.Array.from_buffers(pa.int64(), count, [None, buf(values)])])
    columns = {
        "root": pa.repeat(pa.scalar(proc.root, pa.string()), n),
        "process": pa.repeat(pa.scalar(proc.process, pa.string()), n),
        "position": pa.Array.from_buffers(pa.int32(), n, [None, buf(chunk["position"])]),
        "record": names_.take(record),
        "kind": pa.array([k for k, _ in present], pa.string()).take(group),
        "direction": pa.array([d for _, d in present], pa.string()).take(group),
        "arg": strings(chunk["arg"], n),
        "dtype": strings(chunk["dtype"], n),
        "shape": shape,
        "max": floats(chunk["max"]),
        "min": floats(chunk["min"]),
        "mean": floats(chunk["mean"]),
        "norm": floats(chunk["norm"]),
        "md5": strings(chunk["md5"], n),
        "stack_id": pa.array(stack_ids, pa.int32()).take(record) if stack_ids else pa.nulls(n, pa.int32()),
        "data_name": strings(chunk["data_name"], n),
        "placements": texts(chunk["placements"]),
        "device_mesh": texts(chunk["device_mesh"]),
        "error": strings(chunk["error"], n),
    }
    return pa.Table.from_arrays([columns[name] for name in sch.names], schema=sch)


def build(dump_path: str, force: bool = False, select: Optional[Callable[[ProcDir], bool]] = None) -> Dict[str, int]:
    """Index every step/rank directory of ``dump_path`` (that ``select`` accepts: a node's launcher indexes its own
    ranks) whose records changed since it was last indexed.
    Returns {"directories": indexed, "skipped": up to date, "rows": rows written}."""
    done = {"directories": 0, "skipped": 0, "rows": 0}
    with no_collection():  # the rows are acyclic: collections would only rescan them (~30% of the time)
        _build(dump_path, force, select, done)
    return done


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """The cyclic garbage collector off while a reader makes millions of acyclic objects (rows, leaves): each
    collection would rescan every one still alive, and reference counting frees them anyway."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _build(dump_path: str, force: bool, select: Optional[Callable[[ProcDir], bool]], done: Dict[str, int]) -> None:
    for proc in discover(dump_path):
        if not proc.dump or proc.file or (select is not None and not select(proc)):
            continue  # a directory named directly (a rank or step directory) has no index of its own
        if not force and fresh_file(proc) is not None:
            done["skipped"] += 1
            continue
        sources = _sources(proc)  # before reading: a file that changes while it is read leaves the index stale
        target = _file_of(dump_path, proc)
        file = _scannable(proc)
        if file is not None:
            scanned: Dict[str, Any] = {"sources": sources, "header": {}, "errors": [], "records": 0}
            try:
                done["rows"] += _write_tables(target, _scanned(proc, file, scanned), scanned)
                done["directories"] += 1
                continue
            except (ValueError, OSError):
                pass  # left to row_tuples, whose rows and errors are the answer
        header: Dict[str, Any] = {}
        errors: List[Tuple[str, str]] = []
        meta = {"sources": sources, "header": header, "errors": errors, "records": 0}

        def counted(rows: Iterator[tuple], meta: Dict[str, Any] = meta) -> Iterator[tuple]:
            for row in rows:
                meta["records"] = row[2] + 1  # positions run 0..n-1 in order
                yield row

        done["rows"] += _write(target, counted(row_tuples(proc, header, errors)), meta)
        done["directories"] += 1


_COLUMNS_READ = ("position, record, arg, dtype, shape, max, min, mean, norm, md5, data_name, placements, device_mesh, "
                 "error")
_NONFINITE = " OR ".join(f"isnan({c}) OR isinf({c})" for c in ("max", "min", "mean", "norm"))
_CONNECTION: List[Any] = []  # [pid, connection]: one DuckDB connection per process for the readers' scans


def _connection() -> Any:
    if not _CONNECTION or _CONNECTION[0] != os.getpid():
        import duckdb

        con = duckdb.connect()
        con.execute("SET enable_progress_bar = false")  # stdout is the readers'
        _CONNECTION[:] = [os.getpid(), con]
    return _CONNECTION[1]


def _cursor() -> Any:
    """A cursor of its own, so that a consumer may read another directory before a generator is done, or a
    thread read while the caller works (the setting is per cursor)."""
    cursor = _connection().cursor()
    cursor.execute("SET enable_progress_bar = false")
    return cursor


def source_bytes(meta: Dict[str, Any]) -> int:
    """The size of the record files an index file was built from (what a progress bar over them counts)."""
    return sum(size for f, (_, size) in (meta.get("sources") or {}).items() if f != paths.STACK_JSON)


def _rows(cursor: Any) -> Iterator[tuple]:
    while True:
        batch = cursor.fetchmany(BATCH_ROWS)
        if not batch:
            return
        yield from batch


def _records(rows: Iterator[tuple]) -> Iterator[Tuple[int, int, str, List[tuple]]]:
    """(file key, position, record name, its rows) from rows (file key, then ``_COLUMNS_READ``) in file order."""
    current: Optional[Tuple[int, int]] = None
    name = ""
    group: List[tuple] = []
    for row in rows:
        if (row[0], row[1]) != current:
            if current is not None:
                yield current[0], current[1], name, group
            current, name, group = (row[0], row[1]), row[2], []
        group.append(row)
    if current is not None:
        yield current[0], current[1], name, group


def _rebuild(rows: Iterator[tuple]) -> Iterator[Tuple[int, int, str, Any]]:
    """(file key, position, record name, value) from rows as ``_records`` takes them: each record's value holds
    its tensor entries at the same argument paths as in dump.json, so every analysis sees the same leaves,
    statistics and non-finite values (non-tensor arguments are not in the index)."""
    for key, at, name, group in _records(rows):
        value: Any = {}
        for _, _, _, arg, dtype, shape, mx, mn, mean, norm, md5, data_name, placements, mesh, error in group:
            if arg is None:
                continue
            entry: Dict[str, Any] = {"dtype": dtype, "shape": shape, "Max": mx, "Min": mn, "Mean": mean,
                                     "Norm": norm}
            if md5 is not None:
                entry["md5"] = md5
            if data_name is not None:
                entry["data_name"] = data_name
            if placements is not None:
                entry["placements"] = json.loads(placements)
            if mesh is not None:
                entry["device_mesh"] = json.loads(mesh)
            if error is not None:
                entry["error"] = error
            if not arg:  # the record is itself a tensor (a debug save)
                value = entry
                continue
            # two levels are enough: paths are rebuilt by joining keys with ".", and the analyses look up only
            # the first level ("output", "parameters")
            head, dot, rest = arg.partition(".")
            if dot:
                value.setdefault(head, {})[rest] = entry
            else:
                value[head] = entry
        yield key, at, name, value


def iter_indexed(proc: ProcDir, file: str, meta: Dict[str, Any],
                 on_error: Optional[Callable[[str, Exception], None]] = None, header: Optional[Dict[str, Any]] = None,
                 progress: Optional[Callable[[int], None]] = None, position: Optional[int] = None
                 ) -> Iterator[Tuple[int, str, Any, bool]]:
    """``reading.iter_proc`` of a directory, answered by DuckDB from its index file (``_rebuild``); only the
    record at ``position`` when given."""
    read = f"SELECT 0, {_COLUMNS_READ} FROM read_parquet($file)"
    cursor = _cursor()
    if position is not None:
        cursor.execute(read + " WHERE position = $position", {"file": file, "position": position})
    else:
        cursor.execute(read, {"file": file})
    for _, at, name, value in _rebuild(_rows(cursor)):
        yield at, name, value, True
    if position is None:
        replay(proc, meta, on_error, header, progress)


def replay(proc: ProcDir, meta: Dict[str, Any], on_error: Optional[Callable[[str, Exception], None]] = None,
           header: Optional[Dict[str, Any]] = None, progress: Optional[Callable[[int], None]] = None) -> None:
    """What reading the directory's record files did besides its records, from the index file's metadata: its
    header fields, the bytes read, and each error (the message the JSON reader gave)."""
    if header is not None:
        header.update(meta.get("header") or {})
    if progress is not None:
        progress(source_bytes(meta))
    if on_error is not None:
        for f, message in meta.get("errors") or []:
            on_error(os.path.join(proc.path, f), ValueError(message))


def iter_many(files: List[str], where: Tuple[str, Dict[str, Any]], batches: Optional[List[Any]] = None
              ) -> Iterator[Tuple[int, int, str, List[Leaf]]]:
    """(index into ``files``, position, record name, leaves) of the records with rows that meet ``where`` (an SQL
    condition on a row, its named parameters): the leaves are those rows, in the order ``stats.leaves`` gives
    for the rebuilt record (``_rebuild``). Many index files in one DuckDB scan: a step of thousands of ranks is
    one query, not one per rank; the rows come as Arrow batches (``batches``: ``fetch_many``'s, read before),
    made into leaves a column at a time."""
    import numpy as np

    carry: Optional[Tuple[int, int, str, List[Leaf]]] = None  # a record may run on into the next batch
    for batch in batches if batches is not None else _batches(_many(where), {"files": files, **where[1]}):
        if not batch.num_rows:
            continue
        f, at = batch.column(0).to_numpy(), batch.column(1).to_numpy()
        starts = np.flatnonzero(np.concatenate([[True], (f[1:] != f[:-1]) | (at[1:] != at[:-1])])).tolist()
        names_ = _pylist(batch.column(2))
        leaves = _leaves(batch)
        ends = starts[1:] + [batch.num_rows]
        fs, ats = f.tolist(), at.tolist()
        tensorless = None in leaves
        if carry is not None and (carry[0], carry[1]) == (fs[0], ats[0]):
            carry[3].extend(leaf for leaf in leaves[:ends[0]] if leaf is not None)
            starts, ends = starts[1:], ends[1:]
        for s, e in zip(starts, ends):
            if carry is not None:
                yield carry
            group = leaves[s:e]
            carry = (fs[s], ats[s], names_[s], [leaf for leaf in group if leaf is not None] if tensorless else group)
    if carry is not None:
        yield carry


def fetch_many(files: List[str], where: Tuple[str, Dict[str, Any]]) -> List[Any]:
    """The Arrow batches ``iter_many`` reads, read whole: DuckDB reads without holding the GIL, so a thread can
    read a step's files while the caller compares the step before."""
    return list(_batches(_many(where), {"files": files, **where[1]}))


def _many(where: Tuple[str, Dict[str, Any]]) -> str:
    return (f"SELECT list_position($files, filename) - 1 AS f, {_COLUMNS_READ.replace('shape', 'shape::VARCHAR')} "
            "FROM read_parquet($files, filename = true, file_row_number = true, hive_partitioning = false) "
            f"WHERE {where[0]} ORDER BY f, file_row_number")


def _batches(query: str, params: Dict[str, Any]) -> Any:
    """The result of a query as Arrow record batches (DuckDB 2 names the call otherwise than 1.x)."""
    cursor = _cursor()
    relation = cursor.sql(query, params=params)
    if hasattr(relation, "to_arrow_reader"):
        return relation.to_arrow_reader(BATCH_ROWS)
    return cursor.execute(query, params).fetch_record_batch(BATCH_ROWS)


def _pylist(column: Any, convert: Optional[Callable[[Any], Any]] = None) -> List[Any]:
    """An Arrow column as a Python list, each distinct value made (and converted) once."""
    import pyarrow.compute as pc

    if column.null_count == len(column):
        return [None] * len(column)
    coded = pc.dictionary_encode(column)
    values = coded.dictionary.to_pylist()
    if convert is not None:
        values = [convert(v) for v in values]
    values.append(None)
    return list(map(values.__getitem__, coded.indices.fill_null(len(values) - 1).to_numpy().tolist()))


def _shape(text: str) -> Tuple[int, ...]:
    """DuckDB's text of a list of integers ("[32, 64]", "[]") as a shape."""
    inner = text[1:-1]
    return tuple(int(x) for x in inner.split(",")) if inner else ()


def _floats(column: Any) -> List[Optional[float]]:
    return column.to_pylist() if column.null_count else column.to_numpy().tolist()


def _leaves(batch: Any) -> List[Optional[Leaf]]:
    """The leaf of each row of a batch of ``iter_many``'s columns; None for a row without a tensor."""
    col = batch.column
    arg = _pylist(col(3), sys.intern)
    shapes = _pylist(col(5), _shape)  # as text: a list column would be made a Python list per row
    stats = list(zip(_floats(col(6)), _floats(col(7)), _floats(col(8)), _floats(col(9))))
    leaves: List[Optional[Leaf]] = list(map(
        Leaf, arg, _pylist(col(4), sys.intern), shapes, stats, _pylist(col(10)), _pylist(col(11)),
        _pylist(col(12), lambda v: stat_placements(json.loads(v))),
        _pylist(col(13), lambda v: stat_mesh(json.loads(v))), _pylist(col(14))))
    if col(3).null_count:
        leaves = [leaf if name is not None else None for leaf, name in zip(leaves, arg)]
    return leaves


def metadata(dump_path: str) -> Dict[str, Dict[str, Any]]:
    """Every index file's metadata (normalised path -> metadata), in one DuckDB query; {} when the dump has no
    index or the readers are not to use it (``--no-index``)."""
    from msprobe_readers import reading

    if not (reading.USE_INDEX and os.path.isdir(dump_path) and exists(dump_path)):
        return {}
    try:
        return {os.path.normpath(f): json.loads(v) for f, v in _connection().execute(
            f"SELECT file_name, decode(value) FROM parquet_kv_metadata('{_glob(dump_path)}') "
            f"WHERE decode(key) = '{META_KEY.decode()}'").fetchall()}
    except Exception:  # no file yet, or one being replaced: every directory is read from its JSON
        return {}


def fresh_in(proc: ProcDir, metas: Dict[str, Dict[str, Any]]) -> Optional[Tuple[str, Dict[str, Any]]]:
    """``fresh_file`` with the metadata already read (``metadata``)."""
    if not proc.dump or proc.file:
        return None
    file = os.path.normpath(_file_of(proc.dump, proc))
    meta = metas.get(file)
    if meta is None:
        return None
    now = _sources(proc)
    return (file, meta) if now and now == meta.get("sources") else None


def _glob(dump_path: str) -> str:
    return os.path.join(index_root(dump_path), "**", "*.parquet").replace("'", "''")


def first_nonfinite(dump_path: str) -> Dict[str, Tuple[int, str]]:
    """Per index file (normalised path) with a NaN/Inf statistic: the position and name of its first record with
    one; one DuckDB scan of the whole dataset (what ``summary`` needs besides the metadata's record counts)."""
    try:
        found = _connection().execute(
            f"SELECT filename, min(position), arg_min(record, position) "
            f"FROM read_parquet('{_glob(dump_path)}', filename = true, hive_partitioning = false) "
            f"WHERE {_NONFINITE} GROUP BY filename").fetchall()
    except Exception:  # no file yet, or one being replaced: every directory is read from its JSON
        return {}
    return {os.path.normpath(f): (position, record) for f, position, record in found}


def exists(dump_path: str) -> bool:
    return os.path.isdir(index_root(dump_path))


def connect(dump_path: str) -> Any:
    """A DuckDB connection with the view ``records`` over the dump's index."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    pattern = _glob(dump_path)
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
