"""Framework-neutral helpers for the nested values that save() accepts (tensors in lists, tuples, dicts)."""

from __future__ import annotations

from typing import Any, Iterator, List, Tuple


def saveable(v: Any, tensor_type: type, depth: int = 0) -> bool:
    """save() takes tensors, int, float, str and lists/tuples/str-keyed dicts of them."""
    if depth > 64:
        return False
    if isinstance(v, (tensor_type, int, float, str)):
        return True
    if isinstance(v, (list, tuple)):
        return all(saveable(x, tensor_type, depth + 1) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and saveable(x, tensor_type, depth + 1) for k, x in v.items())
    return False


def null_shape(v: Any) -> Any:
    """The value's nesting with every leaf null: the gradient record before any gradient arrives."""
    if isinstance(v, (list, tuple)):
        return [null_shape(x) for x in v]
    if isinstance(v, dict):
        return {k: null_shape(x) for k, x in v.items()}
    return None


def copy_shape(v: Any, leaf_type: str) -> Any:
    """A copy of the containers (leaf entries shared), so the writer never reads a structure a hook mutates."""
    if isinstance(v, list):
        return [copy_shape(x, leaf_type) for x in v]
    if isinstance(v, dict) and v.get("type") != leaf_type:
        return {k: copy_shape(x, leaf_type) for k, x in v.items()}
    return v


def put_at(root: Any, path: List[Any], entry: Any) -> Any:
    if not path:
        return entry
    node = root
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = entry
    return root


def tensor_paths(v: Any, tensor_type: type, path: List[Any]) -> Iterator[Tuple[Any, List[Any]]]:
    if isinstance(v, tensor_type):
        yield v, list(path)
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            yield from tensor_paths(x, tensor_type, path + [i])
    elif isinstance(v, dict):
        for k, x in v.items():
            yield from tensor_paths(x, tensor_type, path + [k])
