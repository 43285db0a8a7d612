"""The recording protocol, tested once through a fake framework: what both adapters get from the recorder."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import warnings
from typing import Any, Dict, List, Optional

import pytest

from msprobe_inject import config
from msprobe_inject.recorder import Recorder
from msprobe_inject.threadstate import quiet_sections


class FakeTensor:
    def __init__(self, value: float):
        self.value = value


class FakeEncoder:
    some_files = False

    def __init__(self, fail_on: Optional[float] = None):
        self.fail_on = fail_on

    def wants_files(self, key: str) -> bool:
        return False

    def tensor(self, t: FakeTensor, pending: list, file_name: Optional[str]) -> Any:
        if t.value == self.fail_on:
            raise RuntimeError("encoder broke")
        entry = {"type": "fake.Tensor", "Max": None}
        pending.append((entry, t.value))  # resolved by the writer thread, as real statistics are
        return entry

    def encode(self, value: Any, pending: list, file_prefix: Optional[str]) -> Any:
        if isinstance(value, FakeTensor):
            return self.tensor(value, pending, None)
        if isinstance(value, (list, tuple)):
            return [self.encode(v, pending, None) for v in value]
        if isinstance(value, dict):
            return {k: self.encode(v, pending, None) for k, v in value.items()}
        return {"type": type(value).__name__, "value": value}


class FakeState(threading.local):
    def __init__(self) -> None:
        self.busy = False
        self.in_api = False
        self.stack: List[str] = []


class FakeFramework:
    name = "fake"
    tensor_type = FakeTensor
    tensor_type_name = "fake.Tensor"
    file_suffix = ".bin"
    native: Dict[str, bool] = {}

    def __init__(self, fail_on: Optional[float] = None):
        self.tls = FakeState()
        self.fail_on = fail_on
        self.api: List[bool] = []
        self.registered: List[Any] = []
        self.grad_hooks: List[Any] = []
        self.steps = 0
        self.restored = False

    def rank(self) -> Optional[int]:
        return 3

    @staticmethod
    def resolve(pending: list) -> None:
        for entry, v in pending:
            entry["Max"] = v

    @staticmethod
    def resolve_host(pending: list) -> list:
        return pending  # as a device's: read by the writer thread, which journals the figures too

    @staticmethod
    def save_tensor(tensor: Any, path: str) -> None:
        raise AssertionError("no tensor files in these tests")

    def make_encoder(self, cfg, tensor_dir, writer) -> FakeEncoder:
        return FakeEncoder(self.fail_on)

    @property
    def quiet(self):
        return quiet_sections(self.tls, None)

    def install(self, recorder: Recorder) -> None:
        self.rec = recorder

    def set_api(self, on: bool) -> None:
        self.api.append(on)

    def models(self, model):
        return [(None, model)]

    def register_model(self, model, index, skip_optimizers) -> None:
        self.registered.append(model)

    def cannot_record(self) -> Optional[str]:
        return None

    def token_range(self, token_range):
        return None

    def grad_enabled(self) -> bool:
        return True

    def grad_leaves(self, value):
        from msprobe_inject import values

        return list(values.tensor_paths(value, FakeTensor, []))

    def on_grad(self, t, hook) -> None:
        self.grad_hooks.append(hook)

    def on_step(self) -> None:
        self.steps += 1

    def want_module_calls(self) -> None:
        pass

    def restore(self) -> None:
        self.restored = True


def _recorder(tmp_path, fw=None, **cfg):
    cfg.setdefault("level", "mix")
    fw = fw or FakeFramework()
    return Recorder(config.build_config({"dump_path": str(tmp_path / "d"), **cfg}), fw), fw


def _data(tmp_path, step=0, name="dump.json"):
    return json.loads((tmp_path / "d" / f"step{step}" / "rank3" / name).read_text())


def test_module_record_holds_inputs_outputs_parameters_at_its_completion(tmp_path):
    rec, fw = _recorder(tmp_path)
    rec.start(model=object())
    frame = rec.module_enter("Module.fc.Linear.", (FakeTensor(1.0),), None)
    rec.record("Functional.linear.0.forward", {"output": [{"type": "int", "value": 7}]}, None)
    rec.module_exit(frame, {"scale": 2}, FakeTensor(5.0), lambda: {"weight": FakeTensor(9.0)})
    rec.stop()
    d = _data(tmp_path)
    assert d["framework"] == "fake" and d["level"] == "mix"
    assert list(d["data"]) == ["Functional.linear.0.forward", "Module.fc.Linear.forward.0"]
    body = d["data"]["Module.fc.Linear.forward.0"]
    assert list(body) == ["input_args", "input_kwargs", "output", "parameters"]
    assert body["input_args"][0]["Max"] == 1.0 and body["output"][0]["Max"] == 5.0
    assert body["input_kwargs"] == {"scale": {"type": "int", "value": 2}}
    assert body["parameters"]["weight"]["Max"] == 9.0
    assert _data(tmp_path, name="construct.json") == {"Module.fc.Linear.forward.0": None}
    from msprobe_inject.dumpformat import journal

    replayed, _, complete = journal.replay(str(tmp_path / "d" / "step0" / "rank3" / "dump.journal"))
    assert not complete and dict(replayed.items()) == d["data"]  # the figures the writer read are journaled
    assert fw.api == [True, False]


def test_module_backward_and_parameter_gradients(tmp_path):
    rec, fw = _recorder(tmp_path)
    rec.start(model=object())
    frame = rec.module_enter("Module.fc.Linear.", (FakeTensor(1.0),), None)
    rec.module_exit(frame, None, FakeTensor(2.0), dict)
    rec.module_backward_pre(frame.bkey)
    assert fw.tls.stack == [frame.bkey]
    rec.module_backward(frame.bkey, (FakeTensor(3.0),), (FakeTensor(4.0),))
    assert fw.tls.stack == []
    rec.param_grad("Module.fc.Linear.", "weight", lambda: FakeTensor(5.0))
    rec.param_grad("Module.fc.Linear.", "bias", lambda: FakeTensor(6.0))
    rec.param_grad("Module.fc.Linear.", "weight", lambda: FakeTensor(7.0))  # a second accumulation
    fw.tls.busy = True  # the tool's own work: nothing is recorded
    rec.param_grad("Module.fc.Linear.", "weight", lambda: FakeTensor(8.0))
    fw.tls.busy = False
    rec.stop()
    data = _data(tmp_path)["data"]
    bw = data["Module.fc.Linear.backward.0"]
    assert bw["input"][0]["Max"] == 4.0 and bw["output"][0]["Max"] == 3.0  # msprobe: input = grad of outputs
    assert data["Module.fc.Linear.parameters_grad.0"] == {"weight": [{"type": "fake.Tensor", "Max": 5.0}],
                                                          "bias": [{"type": "fake.Tensor", "Max": 6.0}]}
    assert data["Module.fc.Linear.parameters_grad.1"] == {"weight": [{"type": "fake.Tensor", "Max": 7.0}]}
    assert "Module.fc.Linear.parameters_grad.2" not in data


class _GuardFails:
    """A dispatch guard whose entry fails (the framework's own error)."""

    def __enter__(self):
        raise RuntimeError("guard refused")

    def __exit__(self, *exc):
        raise AssertionError("a guard that was never entered is not left")


def _use_quiet(rec: Recorder, quiet) -> None:
    """The sections the recorder's bodies enter from now on, as it reads them from fw.quiet when made."""
    rec._quiet, rec._enter_quiet, rec._leave_quiet = quiet, quiet.enter, quiet.leave


@pytest.mark.filterwarnings("ignore:.*guard refused:RuntimeWarning")
def test_a_failing_dispatch_guard_stays_in_the_hooks_and_leaves_the_thread_recording(tmp_path):
    """The hot hooks enter a quiet section per record, inside their own error handling: a dispatch guard that fails
    is a logged tool error, never an exception into the forward or backward pass, and the busy flag goes back, so
    the next record is made."""
    fw = FakeFramework()
    rec, _ = _recorder(tmp_path, fw)
    rec.start(model=object())
    frame = rec.module_enter("Module.fc.Linear.", (FakeTensor(1.0),), None)
    _use_quiet(rec, quiet_sections(fw.tls, _GuardFails))
    rec.module_exit(frame, None, FakeTensor(2.0), dict)
    rec.module_backward(frame.bkey, (FakeTensor(3.0),), (FakeTensor(4.0),))
    rec.param_grad("Module.fc.Linear.", "weight", lambda: FakeTensor(5.0))
    assert not fw.tls.busy
    _use_quiet(rec, quiet_sections(fw.tls, None))  # the busy flag alone, as MindSpore's
    rec.param_grad("Module.fc.Linear.", "weight", lambda: FakeTensor(6.0))
    rec.stop()
    data = _data(tmp_path)["data"]
    # the failed gradient counted nothing: the next one is the module's first
    assert data["Module.fc.Linear.parameters_grad.0"] == {"weight": [{"type": "fake.Tensor", "Max": 6.0}]}
    log = (tmp_path / "d" / "step0" / "rank3" / "dump_error_info.log").read_text()
    assert log.count("guard refused") == 3, log


def test_steps_counters_and_step_selection(tmp_path):
    rec, fw = _recorder(tmp_path, step=[0, 1])
    for _ in range(3):
        rec.start(model=object())
        for _ in range(2):
            rec.module_exit(rec.module_enter("Module.fc.Linear.", (), None), None, FakeTensor(1.0), dict)
        rec.stop()
        rec.step()
    for step in (0, 1):
        assert list(_data(tmp_path, step)["data"]) == ["Module.fc.Linear.forward.0", "Module.fc.Linear.forward.1"]
    assert not (tmp_path / "d" / "step2").exists()
    assert rec.session.ended and fw.steps == 3


def test_list_filter_keeps_counters(tmp_path):
    rec, fw = _recorder(tmp_path, list=["fc2"])
    rec.start(model=object())
    for prefix in ("Module.fc1.Linear.", "Module.fc2.Linear.", "Module.fc1.Linear."):
        rec.module_exit(rec.module_enter(prefix, (), None), None, FakeTensor(1.0), dict)
    rec.stop()
    assert list(_data(tmp_path)["data"]) == ["Module.fc2.Linear.forward.0"]


def test_save_records_value_then_gradient_leaves(tmp_path):
    rec, fw = _recorder(tmp_path, level="debug")
    rec.start()
    rec.save({"a": FakeTensor(1.0), "b": [FakeTensor(2.0), 3]}, "act")
    assert len(fw.grad_hooks) == 2
    rec.stop()
    d = _data(tmp_path, name="debug.json")["data"]
    assert d["act.0.debug"]["a"]["Max"] == 1.0
    assert d["act_grad.0.debug"] == {"a": None, "b": [None, None]}
    fw.grad_hooks[1](FakeTensor(20.0))
    rec.stop()
    d = _data(tmp_path, name="debug.json")["data"]
    assert d["act_grad.0.debug"] == {"a": None, "b": [{"type": "fake.Tensor", "Max": 20.0}, None]}


def test_tool_failure_is_logged_never_raised(tmp_path):
    rec, fw = _recorder(tmp_path, fw=FakeFramework(fail_on=13.0))
    rec.start(model=object())
    with pytest.warns(RuntimeWarning, match="module pre-hook failed"):
        frame = rec.module_enter("Module.fc.Linear.", (FakeTensor(13.0),), None)
    assert frame is None
    with pytest.warns(RuntimeWarning, match="parameters_grad: capture failed"):
        rec.param_grad("Module.fc.Linear.", "weight", lambda: FakeTensor(13.0))
    rec.stop()
    log = (tmp_path / "d" / "step0" / "rank3" / "dump_error_info.log").read_text()
    assert "module pre-hook failed: RuntimeError: encoder broke" in log
    assert "parameters_grad: capture failed: RuntimeError: encoder broke" in log


def test_the_same_failure_of_many_records_is_one_warning_and_every_record_is_logged(tmp_path):
    rec, fw = _recorder(tmp_path, fw=FakeFramework(fail_on=13.0))
    rec.start(model=object())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for prefix in ("Module.a.Linear.", "Module.b.Linear.", "Module.c.Linear."):
            assert rec.module_enter(prefix, (FakeTensor(13.0),), None) is None
    rec.stop()
    shown = [str(w.message) for w in caught if "pre-hook failed" in str(w.message)]
    assert len(shown) == 1 and "Module.a.Linear.forward.0" in shown[0], shown
    log = (tmp_path / "d" / "step0" / "rank3" / "dump_error_info.log").read_text()
    assert [f"Module.{m}.Linear.forward.0: module pre-hook failed" in log for m in "abc"] == [True] * 3


def test_restore_switches_interception_off_and_removes_hooks(tmp_path):
    rec, fw = _recorder(tmp_path)
    rec.start(model=object())
    rec.restore()
    assert fw.api[-1] is False and fw.restored and not rec.api_on


class LateRankFramework(FakeFramework):
    """torch.distributed comes up in the middle of a step: the rank is unknown until ``known`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.known = False
        self.asked = 0

    def rank(self) -> Optional[int]:
        self.asked += 1
        return 5 if self.known else None


def test_a_records_step_directory_check_asks_for_no_rank_and_the_rank_found_later_names_the_step(tmp_path):
    fw = LateRankFramework()
    rec, _ = _recorder(tmp_path, fw)
    rec.start(model=object())
    asked = fw.asked
    for _ in range(50):
        rec.module_exit(rec.module_enter("Module.fc.Linear.", (), None), None, FakeTensor(1.0), dict)
    assert fw.asked == asked  # a record's check is an attribute read, not a lookup per record
    fw.known = True
    for _ in range(2):
        rec.module_exit(rec.module_enter("Module.fc.Linear.", (), None), None, FakeTensor(2.0), dict)
    rec.stop()
    rec.step()
    assert os.listdir(tmp_path / "d" / "step0") == ["rank5"]  # stop() found the rank: proc{pid} was renamed
    data = json.loads((tmp_path / "d" / "step0" / "rank5" / "dump.json").read_text())["data"]
    assert len(data) == 52 and data["Module.fc.Linear.forward.51"]["output"][0]["Max"] == 2.0
    rec.start(model=object())
    rec.module_exit(rec.module_enter("Module.fc.Linear.", (), None), None, FakeTensor(3.0), dict)
    rec.stop()
    rec.step()
    assert os.listdir(tmp_path / "d" / "step1") == ["rank5"]


class QuietCounting(FakeFramework):
    """Counts the quiet sections, and the busy flag inside each: a guard that counts its entries."""

    def __init__(self) -> None:
        super().__init__()
        self.quiets = 0
        self.busy_in_guard: list = []

    @property
    def quiet(self):
        return quiet_sections(self.tls, self._guard)

    @contextlib.contextmanager
    def _guard(self):
        self.quiets += 1
        self.busy_in_guard.append(self.tls.busy)
        yield


def test_a_module_call_recording_only_its_outputs_runs_nothing_quiet_before_them_and_lands_in_its_step(tmp_path):
    """A module's forward pre-hook encodes nothing when only outputs are recorded (data_mode output, the monitor
    preset): it enters no quiet section, and its place and stack still open the step's directory and land there."""
    fw = QuietCounting()
    rec, _ = _recorder(tmp_path, fw, level="L0", data_mode=["output"])
    for step in range(2):
        rec.start(model=object())
        frame = rec.module_enter("Module.fc.Linear.", (FakeTensor(1.0),), None)
        assert fw.quiets == 0
        rec.module_exit(frame, None, FakeTensor(2.0 + step), dict)
        assert fw.quiets == 1
        assert fw.busy_in_guard == [True] and not fw.tls.busy  # the hooks pass through inside, not after
        fw.busy_in_guard.clear()
        fw.quiets = 0
        rec.stop()
        rec.step()
    for step in range(2):
        data = _data(tmp_path, step)["data"]
        assert data == {"Module.fc.Linear.forward.0": {"output": [{"type": "fake.Tensor", "Max": 2.0 + step}],
                                                       "parameters": {}}}
        assert _data(tmp_path, step, "construct.json") == {"Module.fc.Linear.forward.0": None}
        stacks = _data(tmp_path, step, "stack.json")
        assert [keys for keys, _ in stacks.values()] == [["Module.fc.Linear.forward.0"]]


def test_a_record_asks_ensure_open_only_while_no_directory_is_ready_or_the_writer_has_stopped(tmp_path):
    """The record ceremony's test (the step's directory ready, the writer not stopped) spares the ensure_open call
    per record; a new step's first record opens its directory, and a writer stopped for good (a full disk) stops the
    session at the next record."""
    rec, fw = _recorder(tmp_path)
    s = rec.session
    calls: List[str] = []
    real = s.ensure_open
    s.ensure_open = lambda kind="dump": calls.append(kind) or real(kind)
    rec.start(model=object())
    assert calls == ["dump"]  # start() opens the step's directory, as msprobe does

    def records(n: int, step: int) -> None:
        for i in range(n):
            rec.record(f"Functional.relu.{step}{i}.forward", {"output": [{"type": "int", "value": i}]}, None)
            rec.merge(f"Module.fc.Linear.forward.{step}{i}", {"output": [{"type": "int", "value": i}]}, None)
            rec.place(f"Functional.relu.{step}{i}.forward", None)
            rec.stack(f"Functional.relu.{step}{i}.forward", 0)

    records(10, 0)
    assert calls == ["dump"]
    rec.stop()
    rec.step()
    rec.start(model=object())
    assert calls == ["dump"] * 2
    s.ready_kind = None  # as before a zero-code step's first record: that record opens the directory
    records(3, 1)
    assert calls == ["dump"] * 3 and s.running
    rec.writer.stopped = True  # what a fatal write error sets, on the writer thread
    records(1, 2)
    assert calls[:4] == ["dump"] * 4 and not s.running and s.ended
    rec.stop()
    d = _data(tmp_path)["data"]
    assert len(d) == 20 and d["Functional.relu.09.forward"]["output"][0]["value"] == 9


def test_module_calls_are_needed_by_module_records_and_by_zero_code_until_its_start(tmp_path):
    """Recorder.module_calls_needed, which lets an adapter take its module hooks out: the module levels always;
    an API level only for zero-code's start at the first top-level call, or its step at each forward's end."""
    needed = {}
    for level in ("L0", "mix", "L1"):
        rec, fw = _recorder(tmp_path / level, level=level)
        needed[level] = rec.module_calls_needed()
        rec.start(model=object())
        needed[level] = (needed[level], rec.module_calls_needed())
    assert needed == {"L0": (True, True), "mix": (True, True), "L1": (False, False)}
    for step_on, after in (("optimizer", False), ("forward", True)):
        fw = FakeFramework()
        rec = Recorder(config.build_config({"dump_path": str(tmp_path / step_on), "level": "L1", "step_on": step_on}),
                       fw, zero_code=True)
        assert rec.module_calls_needed()  # the first top-level call starts the dump
        rec.top_level_call(object())
        assert rec.module_calls_needed() is after, step_on
        rec.manual = True  # the script made its own debugger: it starts and steps
        assert not rec.module_calls_needed()
