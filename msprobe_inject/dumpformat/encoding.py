"""The JSON encoding of record bodies and documents: every body is encoded once, by one C encoder."""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, Optional, Tuple

from .entry import plain
from .nonfinite import SUSPECT_TEXT

encode_key: Callable[[str], str] = json.encoder.encode_basestring_ascii  # a quoted, escaped key


def _make_encode() -> Callable[[Any], str]:
    """json.dumps without its per-call set-up, through the one-buffer C encoder (_jenc.c) where it is built.

    Record bodies are acyclic by construction (the encoders cut cycles), so no circular check.
    JSONEncoder.encode builds a new C encoder (and a closure) on every call: ~15 % of a record's encoding.
    The stdlib's C encoder then joins a str chunk per key and value; _jenc writes one buffer, about twice as
    fast, and hands anything it does not decide exactly as json would back to json.
    """
    std = json.JSONEncoder(check_circular=False, default=plain).encode  # plain: an entry of C values
    sample = {"a": [1, -2.5, float("nan"), float("inf"), -float("inf"), None, True, False],
              "s": "\u00e9\n\"\\\x7f\U0001f600", "b": {}, "c": [[], ()], "d": 10**30, "e": -(2**63),
              "f": 1e-7, "g": 1e16, "h": 0.1}
    try:
        from json.encoder import c_make_encoder

        c_enc = c_make_encoder(None, plain, json.encoder.encode_basestring_ascii, None,
                               ": ", ", ", False, False, True)

        def via_json(o: Any, _c=c_enc, _join="".join) -> str:
            return _join(_c(o, 0))

        if not all(via_json(v) == std(v) for v in (sample, "s", None, 3.0, [])):
            via_json = std
    except Exception:  # pragma: no cover - a Python without the C accelerator
        via_json = std
    try:
        from ._jenc import encode as c_one

        def encode(o: Any, _one=c_one, _json=via_json) -> str:
            s = _one(o)
            return s if s is not None else _json(o)

        if all(encode(v) == std(v) for v in (sample, "s", None, 3.0, [])):
            return encode
    except Exception:  # without a C compiler: the stdlib's encoder
        pass
    return via_json


encode: Callable[[Any], str] = _make_encode()


def is_suspect(encoded: str) -> bool:
    """Whether an encoded record may hold a non-finite statistic (the writer marks these as they arrive): one of
    nonfinite.SUSPECT_TEXT in its text."""
    found = _suspect(encoded) if _suspect is not None else None
    return any(s in encoded for s in SUSPECT_TEXT) if found is None else found


try:  # one memmem per token over the ASCII text encode() returns
    from ._jenc import suspect as _suspect
except ImportError:  # without a C compiler
    _suspect = None


def _make_encode_scan() -> Callable[[Any], Tuple[str, bool]]:
    """(encode(o), is_suspect of that text): the writer asks both of every record, and _jenc answers both in the one
    pass that writes the text (a scan of the text afterwards cost as much again)."""
    def scan_after(o: Any) -> Tuple[str, bool]:
        text = encode(o)
        return text, is_suspect(text)

    try:
        from ._jenc import encode_scan as c_scan
    except ImportError:  # without a C compiler
        return scan_after

    def encode_scan(o: Any, _scan=c_scan, _after=scan_after) -> Tuple[str, bool]:
        got = _scan(o)
        return got if got is not None else _after(o)

    return encode_scan


encode_scan: Callable[[Any], Tuple[str, bool]] = _make_encode_scan()


def _make_events() -> Optional[Callable[..., int]]:
    """_jenc.events (the writer's handlers of a run of records, their members, stacks and module tree places, see
    _jenc.c) where the C encoder is the one encode uses, else None."""
    try:
        from ._jenc import encode as c_one
        from ._jenc import events
    except ImportError:
        return None
    return events if encode.__defaults__ and encode.__defaults__[0] is c_one else None


events_into: Optional[Callable[..., int]] = _make_events()

try:  # dump.json's "data" member from the records' texts in one C call (_jenc.data); None: joined in Python
    from ._jenc import data as data_section
except ImportError:  # without a C compiler
    data_section = None


def encode_members(members: Dict[str, Any]) -> Dict[str, str]:
    """Each member of a partial record body encoded on its own (see documents.StepRecords.merge)."""
    return {k: encode(v) for k, v in members.items()}


def join_members(members: Dict[str, str]) -> str:
    """The JSON object of encoded members."""
    return "{" + ", ".join(f"{encode_key(k)}: {v}" for k, v in members.items()) + "}"


def _std_document(obj: Any) -> bytes:
    return json.dumps(obj, indent=1).encode("ascii")


def _make_document() -> Callable[[Any], bytes]:
    """msprobe's own formatting of stack.json and construct.json: indent=1, NaN/Infinity tokens, ASCII. With an
    indent json takes its pure-Python encoder (~10 us per stack); the writer formats both documents at every
    stop() while the training thread waits, so the C encoder writes them where it is built."""
    sample = {"0": [["Module.a.forward.0", "Torch.add.0.forward"], ["File \"x.py\", line 3, in f,\n  y = 1"]],
              "b": {}, "c": [[], ()], "d": None, "e": [1, -2.5, float("nan"), True], "\u00e9": "\U0001f600"}
    try:
        from ._jenc import document as c_doc

        def document(o: Any, _doc=c_doc) -> bytes:
            s = _doc(o)
            return s if s is not None else _std_document(o)

        if all(document(v) == _std_document(v) for v in (sample, {}, [], None, "s")):
            return document
    except Exception:  # without a C compiler: json's
        pass
    return _std_document


dumps_document: Callable[[Any], bytes] = _make_document()
