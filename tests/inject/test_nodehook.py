"""The C++ node hooks (msprobe_inject.nodehook): what they call and hand back against torch's own Python hooks,
under compiled autograd, and the cache that builds and loads them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from torch._dynamo import compiled_autograd

from msprobe_inject import envvars, nodehook
from tests.util import clean_env, rank_dir, run_config

needs_binary = pytest.mark.skipif(nodehook.load() is None, reason="the C++ node hooks are not built (conftest.py)")


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None, reason="no C++ compiler")
def test_a_machine_with_a_compiler_has_them_built():
    """tests/conftest.py builds them as the launcher does: a source or a build that no longer compiles fails here
    (every other test of this module would only be skipped)."""
    failed = nodehook.binary_path(nodehook.tag()).parent / "failed.txt"
    assert nodehook.load() is not None, failed.read_text() if failed.is_file() else "no binary, no failed.txt"


def _native():
    return nodehook.load()


def _copies(values):
    return tuple(None if v is None else v.detach().clone() for v in values)


def _same(a, b) -> bool:
    return len(a) == len(b) and all((x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
                                    for x, y in zip(a, b))


def _backward(loss, compiled: bool) -> None:
    if compiled:
        with compiled_autograd._enable(torch.compile(backend="eager")):
            loss.backward()
    else:
        loss.backward()


def _graph(native: bool, seen: list, compiled: bool = False):
    """x @ w (x without grad: a None among the node's grad_inputs), a hook after its node, an alias hooked before
    its node, a user's tensor hook that doubles the gradient; returns w's gradient."""
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    w = torch.randn(4, 2, requires_grad=True)
    y = x @ w

    def after(grad_inputs, grad_outputs):
        seen.append(("after", _copies(grad_inputs), _copies(grad_outputs)))

    def before(grad_outputs):
        seen.append(("before", _copies(grad_outputs)))
        return None

    if native:
        assert _native().post(y, after) is True
        v = _native().hook_single(y, before)
    else:
        y.grad_fn.register_hook(after)
        v = y[...]
        v.grad_fn.register_prehook(before)
    assert v.grad_fn.name() == "AliasBackward0" and v._base is y
    v.register_hook(lambda g: g * 2)
    _backward((v * v).sum(), compiled)
    return w.grad


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled autograd"])
@needs_binary
def test_the_hooks_see_and_hand_on_what_torchs_python_hooks_do(compiled):
    ours, torchs = [], []
    g_ours = _graph(True, ours, compiled)
    g_torchs = _graph(False, torchs, compiled)
    assert torch.equal(g_ours, g_torchs)
    assert [s[0] for s in ours] == [s[0] for s in torchs] == ["before", "after"]
    for a, b in zip(ours, torchs):
        assert all(_same(p, q) for p, q in zip(a[1:], b[1:]))
    assert ours[1][1][0] is None  # x's gradient: x does not require one
    # the user's tensor hook ran first: the node hook sees the doubled gradient
    assert torch.equal(ours[0][1][0], ours[1][2][0])


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled autograd"])
@needs_binary
def test_post_calls_its_hook_with_the_arguments_it_holds_before_the_gradients(compiled):
    """post(t, fn, *bound) calls fn(*bound, grad_inputs, grad_outputs), as torch calls a partial(fn, *bound)
    registered on the node; under compiled autograd it hands the graph such a partial. At most six bound."""
    import functools

    def run(native: bool) -> list:
        seen: list = []

        def after(key, record, grad_inputs, grad_outputs):
            seen.append((key, record, _copies(grad_inputs), _copies(grad_outputs)))

        torch.manual_seed(0)
        x = torch.randn(3, 4, requires_grad=True)
        y = x @ torch.randn(4, 2)
        key = "Torch.matmul.0.backward"
        if native:
            assert _native().post(y, after, key, True) is True
        else:
            y.grad_fn.register_hook(functools.partial(after, key, True))
        _backward((y * y).sum(), compiled)
        return seen

    ours, torchs = run(True), run(False)
    assert len(ours) == len(torchs) == 1 and ours[0][:2] == torchs[0][:2] == ("Torch.matmul.0.backward", True)
    assert _same(ours[0][2], torchs[0][2]) and _same(ours[0][3], torchs[0][3])
    y = torch.randn(2, requires_grad=True) * 2
    with pytest.raises(TypeError):
        _native().post(y, print, *range(7))
    assert _native().post(y, print, *range(6)) is True


@needs_binary
def test_a_hook_that_raises_changes_nothing_and_raises_nothing():
    def boom(*args):
        raise ValueError("a tool bug")

    torch.manual_seed(0)
    x = torch.randn(3, 4, requires_grad=True)
    plain = (torch.relu(x * 3)).sum()
    plain.backward()
    expected = x.grad.clone()
    x.grad = None
    y = x * 3
    assert _native().post(y, boom)
    z = torch.relu(_native().hook_single(y, boom))
    z.sum().backward()
    assert torch.equal(x.grad, expected)


@needs_binary
def test_no_hook_where_there_is_no_node():
    x = torch.randn(2, requires_grad=True)
    called = []
    assert _native().post(x, called.append) is False  # a leaf
    with torch.no_grad():
        assert _native().post(x * 2, called.append) is False
        y = x * 2
        assert _native().hook_single(y, called.append) is y
    with pytest.raises(TypeError):
        _native().post([x], called.append)
    assert not called


@needs_binary
def test_a_binary_of_another_tag_or_no_binary_is_not_loaded(tmp_path, monkeypatch):
    built = nodehook.binary_path(nodehook.tag())
    monkeypatch.setenv(envvars.CACHE_DIR, str(tmp_path))
    other = nodehook.binary_path("0" * 20)
    other.parent.mkdir(parents=True)
    shutil.copy(built, other)  # a real binary, built for this torch, found under another torch's tag
    assert nodehook.load("0" * 20) is None
    garbage = nodehook.binary_path("1" * 20)
    garbage.parent.mkdir(parents=True)
    garbage.write_bytes(b"not an ELF file")
    assert nodehook.load("1" * 20) is None
    assert nodehook.load() is None  # nothing under this tag in the empty cache
    mine = nodehook.binary_path(nodehook.tag())
    mine.parent.mkdir(parents=True)
    shutil.copy(built, mine)
    os.chmod(mine.parent, 0o755)  # whatever the umask
    os.chmod(mine, 0o755)
    assert nodehook.load() is not None
    # writable by others: refused (another user's code in every rank), the binary or its directory
    os.chmod(mine, 0o775)
    assert nodehook.load() is None
    os.chmod(mine, 0o755)
    os.chmod(mine.parent, 0o777)
    assert nodehook.load() is None
    os.chmod(mine.parent, 0o755)
    assert nodehook.load() is not None
    monkeypatch.setenv(envvars.NODE_HOOK, "0")
    assert nodehook.load() is None


def test_a_build_that_fails_says_why_once_and_is_not_retried_at_every_launch(tmp_path):
    env = dict(os.environ, **{envvars.CACHE_DIR: str(tmp_path), "CXX": "/nonexistent/c++", "CC": "/nonexistent/cc"})
    said = nodehook.build(environ=env)
    assert said.startswith("not built (") and "failed.txt" in said
    failed = nodehook.binary_path(nodehook.tag(), env).parent / "failed.txt"
    assert failed.is_file() and "exit code" in failed.read_text()
    assert nodehook.build(environ=env) == ""  # within a day: not tried again
    assert not nodehook.binary_path(nodehook.tag(), env).exists()
    assert [p.name for p in failed.parent.iterdir()] == ["failed.txt"]  # the build's own directory removed
    assert nodehook.build(environ=dict(env, **{envvars.NODE_HOOK: "0"})) == ""


WHICH_HOOKS = """
import msprobe_inject.pytorch.state as _state
with open("native.txt", "w") as fh:
    fh.write("1" if _state.hook_after is not None and _state.hook_single is not None else "0")
"""


@pytest.mark.parametrize("level", ["mix", "L0"])
@needs_binary
def test_a_dump_is_the_same_through_the_cpp_hooks_and_through_torchs_python_api(tmp_path, level):
    dumps = {}
    for way, value in (("native", "1"), ("python", "0")):
        where = tmp_path / way
        where.mkdir()
        env = clean_env(**{envvars.NODE_HOOK: value})
        dump = run_config(where, steps=2, extra_post=WHICH_HOOKS, env=env, task="statistics", level=level)
        with open(os.path.join(rank_dir(dump, 1), "dump.json")) as fh:
            data = json.load(fh)["data"]
        with open(os.path.join(rank_dir(dump, 1), "construct.json")) as fh:
            dumps[way] = (data, json.load(fh))
        assert where.joinpath("native.txt").read_text() == value
    data, construct = dumps["native"]
    assert any(".backward." in k for k in data)
    assert dumps["native"] == dumps["python"]


@needs_binary
def test_hook_single_takes_one_plain_tensor_and_leaves_every_other_value_to_python():
    hook_single = _native().hook_single
    seen = []
    x = torch.randn(3, 4, requires_grad=True)
    y = x * 2
    out = hook_single(y, seen.append)
    assert type(out) is torch.Tensor and out._base is y and out.grad_fn.name() == "AliasBackward0"
    args = (y,)
    got = hook_single(args, seen.append)
    assert type(got) is tuple and len(got) == 1 and got[0]._base is y
    (out.sum() + 3 * got[0].sum()).backward()
    assert sorted(g[0].sum().item() for g in seen) == [12.0, 36.0]
    # nothing a backward hook can see: the value itself
    plain = torch.randn(2)
    empty = ()
    assert hook_single(plain, seen.append) is plain and hook_single((plain,), seen.append)[0] is plain
    assert hook_single(empty, seen.append) is empty
    with torch.no_grad():
        assert hook_single(y, seen.append) is y
    # the Python capture's: several values, containers other than a tuple, subclasses, other layouts
    for other in ((y, y), [y], {"a": y}, torch.nn.Parameter(torch.randn(2)), y.detach().to_sparse().requires_grad_(),
                  None, 3):
        assert hook_single(other, seen.append) is NotImplemented
    assert len(seen) == 2


@pytest.mark.parametrize("native", [True, False], ids=["C++", "Python"])
@needs_binary
def test_a_captured_chunk_of_a_split_takes_in_place_ops(native, monkeypatch):
    """A split's chunk is a view whose creation meta forbids in-place ops on its views; the capture's alias of it
    gets the default meta, as msprobe's BackwardHookFunction output does (modules._fix_view)."""
    from msprobe_inject.pytorch import modules

    if not native:
        monkeypatch.setattr(modules, "hook_single", None)
    x = torch.randn(4, 2, requires_grad=True)
    a, _ = (x * 1).split(2)
    bw = modules._ModuleBackward(torch.nn.Identity(), lambda *h: None, lambda *p: None)
    out = bw.outputs(a)
    out.add_(1)  # raises on the chunk's own view meta
    assert out.grad_fn.name() != "AliasBackward0"  # rebased: as after torch's BackwardHook, no hook on this path
    out.sum().backward()
    assert torch.equal(x.grad, torch.cat([torch.ones(2, 2), torch.zeros(2, 2)]))


@needs_binary
def test_the_module_builds_ahead_of_a_launch_and_says_where(tmp_path):
    """``python -m msprobe_inject.nodehook``: what an image's build step runs so that no launch compiles."""
    env = clean_env(MSPROBE_CACHE_DIR=str(tmp_path))
    cmd = [sys.executable, "-m", "msprobe_inject.nodehook"]
    broken = dict(env, CC="/nonexistent/cc", CXX="/nonexistent/c++")
    proc = subprocess.run(cmd, env=broken, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "compiling the C++ node hooks" in proc.stdout and "not built (" in proc.stdout
    proc = subprocess.run(cmd, env=broken, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "not retried for a day" in proc.stdout
    mine = nodehook.binary_path(nodehook.tag(), {envvars.CACHE_DIR: str(tmp_path)})
    os.unlink(mine.parent / "failed.txt")
    shutil.copy(nodehook.binary_path(nodehook.tag()), mine)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == f"built before: {mine}"


@pytest.mark.parametrize("native", [True, False], ids=["C++", "Python"])
@needs_binary
def test_one_tensor_inside_a_list_a_dict_or_beside_a_number_is_captured(native, monkeypatch):
    """The Python capture's one-tensor branch (hook_single takes a bare tensor or a tuple of one itself)."""
    from msprobe_inject.pytorch import modules

    if not native:
        monkeypatch.setattr(modules, "hook_single", None)
    for wrap, unwrap in ((lambda t: [t], lambda v: v[0]), (lambda t: {"a": t}, lambda v: v["a"]),
                         (lambda t: (t, 3), lambda v: v[0])):
        x = torch.randn(2, 3, requires_grad=True)
        calls = []
        bw = modules._ModuleBackward(torch.nn.Identity(), lambda m, gi, go, c=calls: c.append(("hook", gi, go)),
                                     lambda m, go, c=calls: c.append(("pre", go)))
        out = bw.outputs(wrap(x * 2))
        assert unwrap(out).grad_fn.name() == "AliasBackward0"
        (unwrap(out) * 3).sum().backward()
        assert [c[0] for c in calls] == ["pre", "hook"]
        assert torch.equal(calls[0][1][0], torch.full((2, 3), 3.0)) and calls[1][1] == ()
        assert torch.equal(x.grad, torch.full((2, 3), 6.0))
