"""A tensor's entry as the encoder's C holds it (``_jenc.Entry``, declared in ``_entry.h``): its figures as C values
where a dict would hold eight keys, four float objects and a shape list. The journal's C writes it as that dict's
marshal stream and the JSON encoder as that dict's text, so the journal's replay and dump.json hold dicts. Python
sees a read-only mapping equal to its dict; a walk over record bodies takes ``MAPPINGS`` where it took ``dict``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional, Tuple

try:  # built with the package where a C compiler is available
    from ._jenc import Entry as _Entry
except ImportError:
    _Entry = None

Entry: Optional[type] = _Entry
MAPPINGS: Tuple[type, ...] = (dict,) if _Entry is None else (dict, _Entry)
if _Entry is not None:
    Mapping.register(_Entry)


def plain(o: Any) -> Any:
    """json's ``default``: an entry as its dict; anything else json does not take is its TypeError."""
    if _Entry is not None and type(o) is _Entry:
        return o.as_dict()
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")
