"""The JSON encoding of record bodies and documents: every body is encoded once, by one C encoder."""

from __future__ import annotations

import json
from typing import Any, Callable, Dict

encode_key: Callable[[str], str] = json.encoder.encode_basestring_ascii  # a quoted, escaped key


def _make_encode() -> Callable[[Any], str]:
    """json.dumps without its per-call set-up: one C encoder for the process.

    Record bodies are acyclic by construction (the encoders cut cycles), so no circular check.
    JSONEncoder.encode builds a new C encoder (and a closure) on every call: ~15 % of a record's encoding.
    """
    std = json.JSONEncoder(check_circular=False).encode
    try:
        from json.encoder import c_make_encoder

        c_enc = c_make_encoder(None, json.JSONEncoder().default, json.encoder.encode_basestring_ascii, None,
                               ": ", ", ", False, False, True)

        def encode(o: Any, _c=c_enc, _join="".join) -> str:
            return _join(_c(o, 0))

        sample = {"a": [1, -2.5, float("nan"), float("inf"), None, True, "\u00e9\n"], "b": {}, "c": [[]]}
        if all(encode(v) == std(v) for v in (sample, "s", None, 3.0, [])):
            return encode
    except Exception:  # pragma: no cover - a Python without the C accelerator
        pass
    return std


encode: Callable[[Any], str] = _make_encode()


def encode_members(members: Dict[str, Any]) -> Dict[str, str]:
    """Each member of a partial record body encoded on its own (see documents.StepRecords.merge)."""
    return {k: encode(v) for k, v in members.items()}


def join_members(members: Dict[str, str]) -> str:
    """The JSON object of encoded members."""
    return "{" + ", ".join(f"{encode_key(k)}: {v}" for k, v in members.items()) + "}"


def dumps_document(obj: Any) -> bytes:
    """msprobe's own formatting of stack.json and construct.json: indent=1, NaN/Infinity tokens, ASCII."""
    return json.dumps(obj, indent=1).encode("ascii")
