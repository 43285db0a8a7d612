"""Record names (dumpformat/names.py): what is built is msprobe's spelling, and parses back to its parts."""

from __future__ import annotations

import pytest

from msprobe_inject.dumpformat import names


@pytest.mark.parametrize("prefix,api,index,direction,want", [
    ("Functional", "linear", 0, names.FORWARD, "Functional.linear.0.forward"),
    ("Tensor", "__add__", 12, names.BACKWARD, "Tensor.__add__.12.backward"),
    ("Primitive", "add.Add", 3, names.FORWARD, "Primitive.add.Add.3.forward"),
    ("Torch", "{0}", 1, names.FORWARD, "Torch.{0}.1.forward"),  # a brace in a name is the name's, not the template's
])
def test_an_api_call_is_named_as_msprobe_names_it_and_parses_back(prefix, api, index, direction, want):
    key = names.api_key(names.api_base(prefix, api), index, direction)
    assert key == want
    assert names.parse(key) == names.RecordName("api", prefix, api, "", direction, index)


@pytest.mark.parametrize("model_index", [None, 1])
def test_a_module_call_and_its_parameters_gradient_are_named_as_msprobe_names_them(model_index):
    prefix = names.module_prefix("Module", "layers.0.fc", "Linear", model_index)
    path = "layers.0.fc" if model_index is None else "1.layers.0.fc"
    assert prefix == f"Module.{path}.Linear."
    for direction, index in ((names.FORWARD, 0), (names.BACKWARD, 7)):
        key = names.module_key(prefix, direction, index)
        assert key == f"Module.{path}.Linear.{direction}.{index}"
        assert names.parse(key) == names.RecordName("module", "Module", path, "Linear", direction, index)
    key = names.param_grad_key(prefix, 2)
    assert key == f"Module.{path}.Linear.parameters_grad.2" and names.is_parameters_grad(key)
    assert names.forward_counterpart(key) == [key, f"Module.{path}.Linear.forward.2", f"Module.{path}.Linear.forward.0"]
