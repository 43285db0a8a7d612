"""The journal (dumpformat/journal.py): what the writer journaled rebuilds the same documents."""

from __future__ import annotations

import json
import os


def test_journal_alone_rebuilds_the_step(tmp_path):
    """What the writer journaled (repeated stacks by reference, merged updates) rebuilds the same files."""
    from msprobe_inject.dumpformat import journal
    from msprobe_inject.dumpformat.journal import recover
    from msprobe_inject.writer import Construct, DumpWriter, Merge, Record

    d = str(tmp_path / "step0" / "rank0")
    w = DumpWriter(lambda pending: None, lambda t, p: None, keep_journal=True)
    w.open_step(d, {"task": "statistics", "level": "mix", "dump_data_dir": None, "_root": str(tmp_path)})
    sites = {"linear": lambda key: w.stack(key, 0),
             "relu": lambda key: w.stack(key, 0)}  # two call sites, each seen three times
    for i in range(3):
        for api, site in sites.items():
            key = f"Functional.{api}.{i}.forward"
            site(key)
            w.send(Record(key, {"input_args": [{"type": "int", "value": i}], "input_kwargs": {}}, None))
    w.send(Merge("Module.fc.Linear.parameters_grad.0", {"weight": [{"type": "float", "value": 1.5}]}, None, False))
    w.send(Merge("Module.fc.Linear.parameters_grad.0", {"bias": [{"type": "float", "value": float("nan")}]}, None,
                 False))
    w.send(Construct("Functional.linear.0.forward", None))
    w.close()
    written = {n: open(os.path.join(d, n)).read() for n in ("dump.json", "stack.json", "construct.json")}
    ops = [op[0] for op in journal._ops(open(os.path.join(d, "dump.journal"), "rb").read())]
    assert ops.count("stackdef") == 2 and ops.count("stack") == 6  # each distinct stack's text once
    for n in written:
        os.remove(os.path.join(d, n))
    assert recover(d) == {"records": 8, "complete": True}  # 6 records and 2 merged gradients
    for n, text in written.items():
        assert open(os.path.join(d, n)).read() == text, n
    stacks = json.loads(written["stack.json"])
    assert sorted(len(v[0]) for v in stacks.values()) == [3, 3]
    grads = json.loads(written["dump.json"])["data"]["Module.fc.Linear.parameters_grad.0"]
    assert grads["weight"][0]["value"] == 1.5 and grads["bias"][0]["value"] != grads["bias"][0]["value"]
