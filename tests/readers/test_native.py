"""msprobe_readers.native: a dump says which processes recorded without the compiled parts (the C++ node hooks
first: an explicit-API script run without the launcher finds them only once built), and the summary says it."""

from __future__ import annotations

import json

import pytest

from msprobe_inject import envvars, nodehook
from msprobe_inject.dumpformat import manifest
from tests.readers.reader_util import dump_cli
from tests.util import clean_env, run_config


@pytest.mark.parametrize("hooks", ["1", "0"])
def test_a_process_without_the_node_hooks_is_named_in_its_entry_the_manifest_and_the_summary(tmp_path, hooks):
    if hooks == "1" and nodehook.load() is None:
        pytest.skip("the C++ node hooks are not built (conftest.py)")
    dump = run_config(tmp_path, steps=1, env=clean_env(**{envvars.NODE_HOOK: hooks}), task="statistics", level="L1")
    entries = [e for _, e in manifest.iter_entries(dump)]
    assert len(entries) == 1 and entries[0]["native"]["node_hooks"] is (hooks == "1")
    assert entries[0]["native"]["api_call"] is True and entries[0]["native"]["entries"] is True
    combined = manifest.build(entries)
    assert combined["native"] == entries[0]["native"] and "native" not in combined["processes"][0]
    text = dump_cli(["summary", dump], tmp_path)
    said = [line for line in text.stdout.splitlines() if line.startswith("recorded without")]
    data = dump_cli(["summary", "--json", dump], tmp_path)
    info = json.loads(data.stdout)["native"]
    if hooks == "1":
        assert said == [] and info == {"processes": 1, "without": {}}
    else:
        assert said == ["recorded without the C++ node hooks (`python -m msprobe_inject.nodehook` builds them for "
                        "this torch; msprobe-launch builds them before the ranks start) in 1 of 1 processes: slower "
                        "recording"]
        assert info == {"processes": 1, "without": {"node_hooks": 1}}


def test_the_manifest_keeps_a_process_its_own_parts_only_where_they_differ_from_the_jobs():
    base = {"attempt": 0, "host": "h", "config": {"level": "L1"}, "versions": {"python": "3"}}
    built = {"node_hooks": True, "api_call": True, "entries": True}
    entries = [dict(base, rank=r, pid=r, native=dict(built)) for r in range(3)]
    entries.append(dict(base, rank=3, pid=3, native=dict(built, node_hooks=False)))
    combined = manifest.build(entries)
    assert combined["native"] == built
    assert [p.get("native") for p in combined["processes"]] == [None, None, None, dict(built, node_hooks=False)]
    assert "native" not in manifest.build([dict(base, rank=0, pid=0)])
