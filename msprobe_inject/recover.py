"""Rebuild the documents of rank directories whose process died (kill -9, OOM) from their journals.

    python -m msprobe_inject.recover DUMP_PATH

A step whose journal lacks its end gets ``"incomplete": true`` in dump.json. The launcher runs
this over the dump path after every job; the journal's format and replay are ``dumpformat.journal``'s.
"""

from __future__ import annotations

import json
import sys

from .dumpformat.journal import recover_tree


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    for d, res in recover_tree(args[0]):
        print(f"{d}: {json.dumps(res)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
