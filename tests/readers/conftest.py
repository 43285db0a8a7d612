"""Every reader test runs twice: reading the JSON files, and reading through the dump's index (DuckDB), which must
give identical answers. In the second form each reader call brings the index up to date first: in-process
through the readers' ``discover``, in a ``msprobe-dump`` subprocess through its ``--index`` option."""

from __future__ import annotations

import os
from typing import List

import pytest

from msprobe_readers import cli, diff, index, ranks, reading, summary

from . import reader_util

_READERS = (reading, summary, diff, ranks, cli)  # every module that holds discover


@pytest.fixture(autouse=True, params=["json", "index"])
def records_source(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "index":
        if request.node.get_closest_marker("json_only"):
            pytest.skip("about the JSON files themselves")
        plain = reading.discover

        def discover(dump_path: str) -> List[reading.ProcDir]:
            if os.path.isdir(dump_path):
                index.build(dump_path)
            return plain(dump_path)

        for module in _READERS:
            monkeypatch.setattr(module, "discover", discover)
        monkeypatch.setattr(reader_util, "INDEX_FIRST", True)
    return request.param
