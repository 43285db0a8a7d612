"""msprobe_readers._jrows, the C accelerator of ``msprobe-dump index``: for a directory whose records are one
dump.json, the Parquet file built from its columns equals, bit for bit, the one ``index.row_tuples`` (the Python
path, the definition) gives; a file it does not take (truncated, not JSON, a value it leaves to Python) is indexed
by the Python path, with today's rows and errors."""

from __future__ import annotations

import json
import os
import random
import re
import struct
from typing import Any, Dict, List, Optional, Tuple

import pytest

from msprobe_readers import index, reading

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("duckdb")
pytestmark = pytest.mark.json_only  # these tests build the index themselves

try:
    from msprobe_readers import _jrows
except ImportError:  # pragma: no cover
    _jrows = None
needs_c = pytest.mark.skipif(_jrows is None, reason="the C extension msprobe_readers._jrows is not built")

NAN, INF = float("nan"), float("inf")
# number tokens json.dumps never writes, put in place of their markers once a document is serialised
RAW = {"@neg0@": "-0", "@E@": "1E5", "@Ep@": "1e+5", "@e-@": "-2.5e-3", "@long@": "123456789012345678901234567",
       "@over@": "1.7976931348623159e308", "@tiny@": "2.4703282292062328e-324", "@zeros@": "0.000000000000000001"}
STAT_VALUES: List[Any] = [1.5, -0.0, 0.0, 0, 7, -3, 2 ** 60, 10 ** 20, 1e308, 1e-310, 5e-324, 0.1, 1 / 3,
                          3.4028234663852886e38, NAN, INF, -INF, True, False, None, "nan", "NaN", " inf ", "-Infinity",
                          "+inf", "+INFINITY", "+nan", "-nan", "infinit", "", "1.5", "\x1cnan\t", "inf\x00", [1],
                          {"a": 1}, *RAW]
KEYS = ["input_args", "input_kwargs", "output", "weight", "bias", "", "a.b", "ключ", 'k"q', "tab\tk", "emoji😀",
        "\u2028", "0", "x\\y", "type", "dtype", "shape", "Ma", "\x7f"]
NAME_PARTS = ["Functional", "Tensor", "Torch", "Module", "Cell", "Distributed", "linear", "layers", "fc1", "Linear",
              "forward", "backward", "parameters_grad", "debug", "0", "12", "007", "x2y", "", "ü", "٣", "a_b"]


def _shape(r: random.Random) -> Any:
    return r.choice([[], [2, 3], [0], [2 ** 40, 1], [-1], "2x3", None, [7]])


def _tensor(r: random.Random) -> Dict[str, Any]:
    e: Dict[str, Any] = {}
    if r.random() < 0.8:
        e["type"] = r.choice(["torch.Tensor", "numpy.ndarray", "mindspore.Tensor", "torch.nn.Parameter", 5, None])
    mode = r.random()
    for stat in ("Max", "Min", "Mean", "Norm"):
        if mode < 0.6 or r.random() < 0.3:
            e[stat] = r.choice(STAT_VALUES)
    if r.random() < 0.8:
        e["dtype"] = r.choice(["torch.float32", "torch.bfloat16", "ü8", 5, None])
    if r.random() < 0.85:
        e["shape"] = _shape(r)
    if r.random() < 0.3:
        e["md5"] = r.choice(["a1b2c3d4", "", None, "ü\n\""])
    if r.random() < 0.2:
        e["data_name"] = r.choice(["Functional.linear.0.forward.input.0.pt", 3, None, "dir/ü.npy"])
    if r.random() < 0.2:
        e["error"] = r.choice(["statistics not computed: float8", 7, None, ""])
    if r.random() < 0.2:
        e["placements"] = r.choice([[{"Shard": {"dim": 0}}, {"Replicate": {}}], [{"Partial": {"reduce_op": "sum"}}],
                                    [], "S(0)", [1.5, NAN, "ü", None, {"k": [INF]}]])
    if r.random() < 0.2:
        e["device_mesh"] = r.choice([[[0, 1], [2, 3]], [0, 1, 2, 3], [], {"mesh": [0]}, [[[0]]]])
    if r.random() < 0.5:
        e["requires_grad"] = r.random() < 0.5
    if r.random() < 0.2:  # a member the index does not read
        e[r.choice([k for k in KEYS if k not in ("type", "dtype", "shape")])] = _value(r, 3)
    if not any(k in e for k in ("Max", "Min", "Mean", "Norm", "md5")) and not (
            isinstance(e.get("type"), str) and e["type"].endswith(("Tensor", "ndarray"))):
        e["type"] = "torch.Tensor"  # a tensor entry without statistics, known by its type
    keys = list(e)
    r.shuffle(keys)
    return {k: e[k] for k in keys}


def _scalar(r: random.Random) -> Any:
    return r.choice([None, True, False, 0, -7, 1.25, NAN, INF, -INF, "s", "ü", "", "x\ny", 10 ** 30, "@neg0@"])


def _value(r: random.Random, depth: int) -> Any:
    k = r.random()
    if depth >= 4 or k < 0.15:
        return _scalar(r)
    if k < 0.45:
        return _tensor(r)
    if k < 0.7:
        return [_value(r, depth + 1) if r.random() < 0.85 else None for _ in range(r.randrange(5))]
    out: Dict[str, Any] = {}
    for _ in range(r.randrange(5)):
        out[r.choice(KEYS)] = _value(r, depth + 1)
    if r.random() < 0.2:
        out["type"] = r.choice(["int", "torch.Size", "slice", 3])
    return out


def _name(r: random.Random, i: int) -> str:
    k = r.random()
    if k < 0.3:
        return f"Functional.{r.choice(['linear', 'relu', 'add'])}.{i}.{r.choice(['forward', 'backward'])}"
    if k < 0.5:
        return f"Module.layers.{i % 7}.Linear.{r.choice(['forward', 'backward'])}.{i}"
    if k < 0.6:
        return f"Module.fc{i % 3}.Linear.parameters_grad.{i % 2}"
    if k < 0.7:
        return f"x{i}.{i}.debug"
    return ".".join(r.choice(NAME_PARTS) for _ in range(r.randint(1, 6))) + r.choice(["", str(i), 'ü"\\', "\t"])


def _record(r: random.Random) -> Any:
    k = r.random()
    if k < 0.05:
        return _scalar(r)  # no tensor: one row with a null arg
    if k < 0.1:
        return _tensor(r)  # the record is itself a tensor (a debug save): arg ""
    if k < 0.15:
        return [_value(r, 1) for _ in range(r.randrange(3))]
    rec: Dict[str, Any] = {}
    for key in r.sample(["input_args", "input_kwargs", "output", "weight", "bias", "", "é"], r.randint(0, 4)):
        rec[key] = _value(r, 1) if r.random() < 0.3 else [_value(r, 2) for _ in range(r.randrange(4))]
    return rec


def _dumps(value: Any, r: random.Random, style: int) -> str:
    ascii_ = r.random() < 0.5
    if style == 0:
        return json.dumps(value, indent=1, ensure_ascii=ascii_)  # as msprobe writes dump.json
    if style == 1:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=ascii_)
    return json.dumps(value, indent=r.choice([None, 2, "\t"]), ensure_ascii=ascii_)


def random_document(r: random.Random) -> Tuple[str, List[str]]:
    """The text of a random dump.json (header members before and after data; sometimes no data, an empty one, two
    data members or one that is not an object) and its record names."""
    style = r.randrange(3)
    members: List[Tuple[str, str]] = []
    head = [("task", "statistics"), ("level", "mix"), ("framework", "pytorch"), ("dump_data_dir", None)]
    for key, value in r.sample(head, r.randint(0, 4)):
        members.append((key, _dumps(value, r, style)))
    names: List[str] = []
    shape = r.random()
    datas = 0 if shape < 0.05 else 2 if shape < 0.1 else 1
    for _ in range(datas):
        if r.random() < 0.05:
            members.append(("data", "[1, 2]"))  # not an object: skipped, and not a header field
            continue
        n = 0 if r.random() < 0.08 else r.randint(1, 40)
        items = []
        for _ in range(n):
            name = _name(r, len(names))
            names.append(name)
            items.append(json.dumps(name, ensure_ascii=r.random() < 0.5) + ": " + _dumps(_record(r), r, style))
        members.append(("data", "{" + ",\n  ".join(items) + "}"))
        for key, value in r.sample([("incomplete", True), ("extra", [1, NAN, {"x": "ü"}]), ("task", "tensor"),
                                    ("é\"", {"nested": [None]})], r.randint(0, 2)):
            members.append((key, _dumps(value, r, style)))
    text = "{" + r.choice([",", ",\n ", " , "]).join(json.dumps(k) + r.choice([":", ": ", " :\n "]) + v
                                                      for k, v in members) + "}" + r.choice(["", "\n", "  \n\t"])
    for marker, token in RAW.items():
        text = text.replace(json.dumps(marker), token)
    return text, names


def _write(root: Any, text: str, names: List[str], r: Optional[random.Random] = None) -> str:
    directory = os.path.join(str(root), "step0", "rank0")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "dump.json"), "w", encoding="utf-8", newline="") as fh:
        fh.write(text)
    if r is not None and names and r.random() < 0.5:  # stack.json: some records with a stack
        stack = {str(i): [r.sample(names, min(len(names), r.randint(1, 3))), [f"File a.py, line {i}, in f"]]
                 for i in range(r.randint(1, 4))}
        with open(os.path.join(directory, "stack.json"), "w", encoding="utf-8") as fh:
            json.dump(stack, fh, indent=1)
    return directory


def _no_python(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the Python path ran: the C scanner left the file to it")


Built = Tuple[Any, Dict[bytes, bytes], List[int]]


def _build(dump: Any, monkeypatch: pytest.MonkeyPatch, c: bool, strict: bool = True) -> Built:
    """(table, file metadata, row group sizes) of the index file of dump's one directory, built by the C path
    (``strict``: and by it alone) or by the Python path."""
    with monkeypatch.context() as m:
        if not c:
            m.setattr(index, "_jrows", None)
        elif strict:
            m.setattr(index, "row_tuples", _no_python)
        done = index.build(str(dump), force=True)
    assert done["directories"] == 1
    (proc,) = reading.discover(str(dump))
    pf = pq.ParquetFile(index._file_of(str(dump), proc))
    return pf.read(), pf.metadata.metadata, [pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)]


def _column(table: Any, name: str) -> List[Any]:
    values = table.column(name).to_pylist()
    if pa.types.is_floating(table.schema.field(name).type):  # bit patterns: NaN equals NaN, -0.0 is not 0.0
        return [None if v is None else struct.pack("<d", v) for v in values]
    return values


def assert_same(a: Built, b: Built) -> None:
    (ta, ma, ga), (tb, mb, gb) = a, b
    assert ta.schema.equals(tb.schema, check_metadata=True)
    assert ta.schema == index.schema()
    assert ma == mb  # the schema as stored, and msprobe's: sources, header, errors, records
    assert ga == gb  # row groups of BATCH_ROWS rows
    for name in ta.column_names:
        assert _column(ta, name) == _column(tb, name), name


def _meta(built: Built) -> Dict[str, Any]:
    return json.loads(built[1][index.META_KEY])


@needs_c
@pytest.mark.parametrize("seed", range(60))
def test_random_documents_give_the_same_index_file_on_both_paths(tmp_path, monkeypatch, seed):
    r = random.Random(seed)
    text, names = random_document(r)
    _write(tmp_path / "d", text, names, r)
    if seed % 3 == 0:
        monkeypatch.setattr(index, "BATCH_ROWS", r.choice([1, 2, 7, 30]))  # chunks and row groups cut records
    by_c = _build(tmp_path / "d", monkeypatch, c=True)
    by_python = _build(tmp_path / "d", monkeypatch, c=False)
    assert_same(by_c, by_python)
    assert _meta(by_c)["errors"] == []


@needs_c
def test_many_random_records_in_one_file(tmp_path, monkeypatch):
    """More records than the parametrised test, in one file cut into many chunks and row groups."""
    r = random.Random(1234)
    names = [_name(r, i) for i in range(3000)]
    items = [json.dumps(name) + ": " + _dumps(_record(r), r, 0) for name in names]
    text = '{"task": "statistics", "data": {' + ",\n  ".join(items) + '}, "incomplete": true}'
    for marker, token in RAW.items():
        text = text.replace(json.dumps(marker), token)
    _write(tmp_path / "d", text, names, r)
    monkeypatch.setattr(index, "BATCH_ROWS", 500)
    by_c = _build(tmp_path / "d", monkeypatch, c=True)
    by_python = _build(tmp_path / "d", monkeypatch, c=False)
    assert by_c[0].num_rows > 3000 and len(by_c[2]) > 5
    assert_same(by_c, by_python)


@needs_c
def test_the_benchmarks_document(tmp_path, monkeypatch):
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    try:
        from reader import write_dump_json
    finally:
        sys.path.pop(0)
    directory = tmp_path / "d" / "step0" / "rank0"
    directory.mkdir(parents=True)
    write_dump_json(str(directory / "dump.json"), 3000, nan_at=2990)
    monkeypatch.setattr(index, "BATCH_ROWS", 999)
    by_c = _build(tmp_path / "d", monkeypatch, c=True)
    assert_same(by_c, _build(tmp_path / "d", monkeypatch, c=False))
    assert by_c[2] == [999] * 8 + [8]  # 8000 rows


# ---- what the C path leaves to the Python path ----

GOOD = ('{"task": "statistics", "data": {"Functional.linear.0.forward": {"input_args": [{"type": "torch.Tensor", '
        '"Max": 1.5, "Min": NaN, "md5": "ab"}]}, "Functional.relu.0.forward": {"output": [{"Max": 2, '
        '"shape": [3]}]}, "Module.fc.Linear.forward.0": {"output": []}}, "incomplete": true}\n')
LEFT_TO_PYTHON = {
    "truncated": GOOD[:GOOD.index('"Functional.relu') + 40],
    "truncated in a number": GOOD[:GOOD.index('2, "shape"')],
    "syntax error": GOOD.replace('"Min": NaN', '"Min": nan'),
    "trailing comma": GOOD.replace('{"output": []}', '{"output": [],}'),
    "data after the document": GOOD + "x",
    "empty file": "",
    "not an object": "[]",
    "not UTF-8": GOOD.replace("ab", "a\udcffb"),
    "control character in a string": GOOD.replace('"ab"', '"a\tb"'),
    # the Python reader takes a key right after its comma as it stands (the escape-free fast path)
    "control character in a record name": GOOD.replace(', "Functional.relu', ',"\tFunctional.relu'),
    "a key twice in a tensor entry": GOOD.replace('"Max": 1.5', '"Max": 1.5, "Max": 9'),
    "a key twice in a record": GOOD.replace('{"output": []}', '{"output": [], "output": [{"Max": 1}]}'),
    "a non-string md5": GOOD.replace('"md5": "ab"', '"md5": 12'),
    "a float in a shape": GOOD.replace('"shape": [3]', '"shape": [3.0]'),
    "a null in a shape": GOOD.replace('"shape": [3]', '"shape": [3, null]'),
    "a shape out of int64": GOOD.replace('"shape": [3]', '"shape": [9223372036854775808]'),
    "a lone surrogate": GOOD.replace('"ab"', '"a\\ud800b"'),
    "non-ASCII statistic text": GOOD.replace('"Max": 1.5', '"Max": "\\u00a0nan"'),
    "a long number": GOOD.replace('"Max": 1.5', '"Max": 1.' + "5" * 400),
    "deep nesting": GOOD.replace('{"output": []}', '{"output": ' + "[" * 500 + "]" * 500 + "}"),
    "a bare NaN record name": GOOD.replace('"Functional.relu.0.forward"', "NaN"),
}


@pytest.mark.parametrize("case", sorted(LEFT_TO_PYTHON))
def test_a_file_the_c_path_does_not_take_gives_todays_rows_and_errors(tmp_path, monkeypatch, case):
    text = LEFT_TO_PYTHON[case]
    directory = _write(tmp_path / "d", "", [])
    with open(os.path.join(directory, "dump.json"), "wb") as fh:
        fh.write(text.encode("utf-8", "surrogateescape"))
    if _jrows is not None:
        with pytest.raises(_jrows.Unhandled):
            scanner = _jrows.Scanner(text.encode("utf-8", "surrogateescape"))
            while scanner.next(1000) is not None:
                pass
    header: Dict[str, Any] = {}
    errors: List[Tuple[str, str]] = []
    (proc,) = reading.discover(str(tmp_path / "d"))
    today = list(index.row_tuples(proc, header, errors))
    if case in ("a shape out of int64", "a lone surrogate"):  # pyarrow does not take it: the build fails as today
        with pytest.raises(Exception) as by_python:
            _build(tmp_path / "d", monkeypatch, c=False)
        with pytest.raises(by_python.type):
            _build(tmp_path / "d", monkeypatch, c=True, strict=False)
        return
    built = _build(tmp_path / "d", monkeypatch, c=True, strict=False)
    assert_same(built, _build(tmp_path / "d", monkeypatch, c=False))
    assert built[0].num_rows == len(today)
    assert [tuple(e) for e in _meta(built)["errors"]] == errors and _meta(built)["header"] == header
    damaged = case in ("truncated", "truncated in a number", "syntax error", "trailing comma", "empty file",
                       "not an object", "not UTF-8", "a bare NaN record name", "control character in a string")
    assert bool(errors) == damaged, errors


@needs_c
def test_what_the_index_does_not_read_is_not_decoded(tmp_path, monkeypatch):
    """A lone surrogate where the index does not read it: no row holds it, so the C path takes the file."""
    text = GOOD.replace('"md5": "ab"', '"md5": "ab", "stack": "a\\udc00b", "extra": {"\\ud800": 1}')
    _write(tmp_path / "d", text, [])
    assert_same(_build(tmp_path / "d", monkeypatch, c=True), _build(tmp_path / "d", monkeypatch, c=False))


@needs_c
def test_a_truncated_file_keeps_the_records_before_the_damage(tmp_path, monkeypatch):
    _write(tmp_path / "d", LEFT_TO_PYTHON["truncated"], [])
    built = _build(tmp_path / "d", monkeypatch, c=True, strict=False)
    assert built[0].column("record").to_pylist() == ["Functional.linear.0.forward"]
    (error,) = _meta(built)["errors"]
    assert error[0] == "dump.json" and error[1]


def test_only_a_lone_dump_json_is_scanned(tmp_path, monkeypatch):
    """debug.json, dump.json beside a debug.json, a journal alone: the Python path, as iter_proc reads them."""
    directory = tmp_path / "d" / "step0" / "rank0"
    directory.mkdir(parents=True)
    (directory / "debug.json").write_text(GOOD)
    (proc,) = reading.discover(str(tmp_path / "d"))
    assert index._scannable(proc) is None
    (directory / "dump.json").write_text(GOOD)
    assert index._scannable(proc) is None
    built = _build(tmp_path / "d", monkeypatch, c=True, strict=False)
    assert built[0].column("position").to_pylist() == [0, 1, 2, 3, 4, 5]  # both files, in turn
    os.remove(directory / "debug.json")
    assert index._scannable(proc) == (str(directory / "dump.json") if _jrows is not None else None)


# ---- the C path's parts ----

@needs_c
def test_float_tokens_parse_as_float_does(tmp_path):
    r = random.Random(7)
    tokens = []
    for _ in range(30000):
        k = r.randrange(6)
        if k == 0:
            tokens.append(repr(struct.unpack("<d", struct.pack("<Q", r.getrandbits(63)))[0]))
        elif k == 1:
            tokens.append(repr(float(struct.unpack("<f", struct.pack("<I", r.getrandbits(31)))[0])))
        elif k == 2:
            digits = "".join(r.choice("0123456789") for _ in range(r.randint(1, 24)))
            tokens.append(f"{digits.lstrip('0') or '0'}.{r.getrandbits(20)}e{r.randint(-345, 310)}")
        elif k == 3:
            tokens.append(str(r.getrandbits(r.randint(1, 80))))
        elif k == 4:
            tokens.append(f"{r.getrandbits(64)}e{r.randint(-40, 40)}")
        else:
            tokens.append(repr(r.getrandbits(53) * 2.0 ** r.randint(-1100, 970)))
        if r.random() < 0.5:
            tokens[-1] = "-" + tokens[-1]
    tokens = [t for t in tokens if "inf" not in t and "nan" not in t]
    tokens += ["1.7976931348623157e308", "1.7976931348623158e308", "1.7976931348623159e308", "5e-324", "4.9e-324",
               "2.4703282292062327e-324", "2.4703282292062328e-324", "2.2250738585072011e-308", "9007199254740993",
               "1.00000000000000011102230246251565404236316680908203125", "1e23", "-0", "-0.0", "0e400", "1e-400"]
    doc = '{"data": {"r": [' + ",".join(f'{{"Max": {t}}}' for t in tokens) + "]}}"
    chunk = _jrows.Scanner(doc.encode()).next(1 << 30)
    got = struct.unpack(f"<{len(tokens)}d", chunk["max"][1])
    want = [float(json.loads(t)) for t in tokens]  # stats._num: float() of the decoded int or float
    bad = [(t, w, g) for t, w, g in zip(tokens, want, got) if struct.pack("<d", w) != struct.pack("<d", g)]
    assert not bad, bad[:5]


def _pow5_128(q: int) -> int:
    if q >= 0:
        p = 5 ** q
        while p < (1 << 127):
            p *= 2
        while p >= (1 << 128):
            p //= 2
        return p
    p = 5 ** -q
    z = p.bit_length()
    if q >= -27:
        return (1 << (z + 127)) // p + 1
    c = (1 << (2 * z + 128)) // p + 1
    while c >= (1 << 128):
        c //= 2
    return c


@needs_c
def test_the_fast_float_path_table():
    if _jrows._pow5(0) is None:
        pytest.skip("no 128-bit integers: dtoa alone")
    for q in range(-342, 309):
        hi, lo = _jrows._pow5(q)
        assert (hi << 64 | lo) == _pow5_128(q), q


def _digits_as_zero(name: str) -> str:
    return re.sub(r"[0-9]+", "0", name)


def test_names_that_differ_in_their_ascii_digits_have_one_kind_and_direction():
    """The premise of the scanner's name groups (see _jrows.c, group_of), held against names.parse."""
    r = random.Random(5)
    words = [w for w in NAME_PARTS if w.isascii()] + ["1", "99", "a1", "1a", "x", "forward0", "0debug", ""]
    for _ in range(20000):
        name = ".".join(r.choice(words) for _ in range(r.randint(1, 7)))
        name = re.sub(r"[0-9]+", lambda m: "".join(r.choice("0123456789") for _ in range(r.randint(1, 4))), name)
        assert index._kind(name) == index._kind(_digits_as_zero(name)), name


@needs_c
def test_the_scanner_groups_names_by_their_digits(tmp_path):
    names = ["Functional.linear.0.forward", "Functional.linear.12.forward", "Functional.linear.3.backward",
             "ü.1.debug", "ü.2.debug", "ü.1.debug", "Module.fc1.Linear.forward.0", "Module.fc22.Linear.forward.5"]
    doc = '{"data": {' + ",".join(json.dumps(n) + ": 1" for n in names) + "}}"
    scanner = _jrows.Scanner(doc.encode())
    chunk = scanner.next(3)
    assert chunk["new_groups"] == ["Functional.linear.0.forward", "Functional.linear.3.backward"]
    assert list(struct.unpack("<3i", chunk["group"])) == [0, 0, 1]
    chunk = scanner.next(100)
    assert chunk["new_groups"] == ["ü.1.debug", "ü.2.debug", "Module.fc1.Linear.forward.0"]
    assert list(struct.unpack("<5i", chunk["group"])) == [0, 1, 0, 2, 2]  # indices into the chunk's groups
    assert list(struct.unpack("<3i", chunk["groups"])) == [2, 3, 4]  # the file's group numbers
    assert scanner.next(100) is None
