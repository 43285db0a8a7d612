"""Module and API records at L0 and mix, and construct.json's tree (pytorch/modules.py, stepping.py)."""

from __future__ import annotations

import json
import os

from util import load_dump, rank_dir, run_config


def test_levels_l0_mix_and_construct(tmp_path):
    dump = run_config(tmp_path, level="L0")
    d = load_dump(dump)["data"]
    assert all(k.startswith("Module.") for k in d)
    assert list(d) == ["Module.fc1.Linear.forward.0", "Module.fc2.Linear.forward.0",
                       "Module.fc2.Linear.parameters_grad.0", "Module.fc2.Linear.backward.0",
                       "Module.fc1.Linear.parameters_grad.0", "Module.fc1.Linear.backward.0"] or \
        set(d) == {"Module.fc1.Linear.forward.0", "Module.fc2.Linear.forward.0", "Module.fc2.Linear.backward.0",
                   "Module.fc1.Linear.backward.0", "Module.fc2.Linear.parameters_grad.0",
                   "Module.fc1.Linear.parameters_grad.0"}
    body = d["Module.fc1.Linear.forward.0"]
    assert list(body) == ["input_args", "input_kwargs", "output", "parameters"]
    assert set(body["parameters"]) == {"weight", "bias"}
    assert set(d["Module.fc1.Linear.parameters_grad.0"]) == {"weight", "bias"}
    construct = json.load(open(os.path.join(rank_dir(dump), "construct.json")))
    assert construct["Module.fc1.Linear.forward.0"] is None


def test_mix_construct_hierarchy_and_optimizer(tmp_path):
    dump = run_config(tmp_path, level="mix")
    construct = json.load(open(os.path.join(rank_dir(dump), "construct.json")))
    assert construct["Functional.linear.0.forward"] == "Module.fc1.Linear.forward.0"
    assert construct["Functional.relu.0.forward"] is None
    assert construct.get("optimizer", "absent") is None
    assert any(v == "optimizer" for v in construct.values())


def test_l0_tensor_files_are_named_as_msprobe_names_them(tmp_path):
    dump = run_config(tmp_path, level="L0", task="tensor")
    files = set(os.listdir(os.path.join(rank_dir(dump), "dump_tensor_data")))
    fc1 = {f for f in files if f.startswith("Module.fc1.")}
    assert fc1 == {"Module.fc1.Linear.forward.0.input.0.pt", "Module.fc1.Linear.forward.0.output.0.pt",
                   "Module.fc1.Linear.forward.0.parameters.weight.pt",
                   "Module.fc1.Linear.forward.0.parameters.bias.pt",
                   "Module.fc1.Linear.parameters_grad.0.weight.pt", "Module.fc1.Linear.parameters_grad.0.bias.pt",
                   "Module.fc1.Linear.backward.0.input.0.pt"}, sorted(fc1)  # its input's gradient is None: no file
