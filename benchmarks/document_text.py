"""stack.json and construct.json on the GPT-2 step of ``overhead.py``: the writer thread formatting them with the C
encoder ("c", ``_jenc.document``) and with json's ``indent=1`` encoder ("json", its pure-Python one), at every
``stop()`` while the training thread waits. One process per configuration, the two ways on alternate steps (ABBA).
Both write the same bytes (checked at start).

    python benchmarks/document_text.py [--steps 40] [--warmup 4] [--only "L1;mix;L0"]

Prints per configuration and way the median step time and the writer thread's CPU time formatting the two
documents (ms per step), and the ratios c / json.
"""

from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from abba import alternate, cli, debugger_for, report, timed  # noqa: E402
from overhead import gpt2, train_step  # noqa: E402


def run(name: str, steps: int, warmup: int, tmp: str) -> dict:
    from msprobe_inject.dumpformat import documents, encoding

    if encoding.dumps_document is encoding._std_document:
        raise SystemExit("the C encoder is not built here (python setup.py build_ext --inplace)")
    sample = {"0": [["Module.a.forward.0"], ["File \"x.py\", line 3, in f,\n  y = 1"]], "k": None}
    if encoding.dumps_document(sample) != encoding._std_document(sample):
        raise SystemExit("the two encoders do not write the same bytes")
    spent = [0.0]
    ways = {"c": timed(encoding.dumps_document, spent, time.thread_time),
            "json": timed(encoding._std_document, spent, time.thread_time)}
    debugger = debugger_for(name, tmp)

    def set_way(way: str) -> None:
        documents.dumps_document = ways[way]  # StepRecords.documents looks it up at each call

    model, opt, ids = gpt2()
    got = alternate(("json", "c"), set_way, lambda: train_step(model, opt, ids, debugger),
                    {"documents": spent}, steps, warmup)
    set_way("c")
    return got


def main() -> None:
    got = cli(__file__, __doc__, run, 40, "L1;mix;L0")
    if got is None:
        return
    a, results = got
    report(results, ("json", "c"), (("step", ".1f"), ("documents", ".3f")), ("step", "documents"),
           f"ms per step, median of {a.steps // 2} each way")


if __name__ == "__main__":
    main()
