"""What the recorder needs from a framework: the written interface the PyTorch and MindSpore adapters implement.

The recorder (``recorder.py``) owns what is recorded, when and under which name; an adapter owns how its
framework is hooked (API interception, module/cell hooks, stepping hooks), how values are encoded and how
statistics are computed. Both adapters have the same rooms under the same file names:
``apis.py`` (API interception), ``modules.py`` (module/cell and backward hooks), ``stepping.py`` (step
boundaries of zero-code runs), ``encode.py`` (values to msprobe's encodings, with the statistics),
``adapter.py`` (this Protocol's implementation) and ``debugger.py`` (the explicit API).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Protocol, Tuple

from .threadstate import QuietSections


class Encoder(Protocol):
    """Values to msprobe's JSON encodings; tensor statistics stay pending until the writer resolves them."""

    some_files: bool  # whether wants_files can hold for any key (asked first on every record)

    def wants_files(self, key: str) -> bool: ...

    def encode(self, value: Any, pending: list, file_prefix: Optional[str]) -> Any: ...

    def tensor(self, t: Any, pending: list, file_name: Optional[str]) -> Any: ...


class ThreadState(Protocol):
    """Per-thread flags shared by an adapter's hooks and the recorder."""

    busy: bool  # the tool itself is running: hooks pass straight through
    in_api: bool  # inside a recorded API: nested APIs are neither recorded nor counted
    stack: List[str]  # keys of the enclosing module records (construct.json parents, mix-level list)


class Framework(Protocol):
    """One framework's side of the recording protocol."""

    name: str  # the "framework" of dump.json
    tensor_type: type  # the leaves save() accepts
    tensor_type_name: str  # the "type" of an encoded tensor entry
    file_suffix: str  # of tensor files: ".pt", ".npy"
    tls: ThreadState
    # the adapter's compiled parts, each loaded or not (a process's manifest entry says which: a rank recording
    # through the Python fallbacks is slower, and nothing else would tell)
    native: Dict[str, bool]

    def rank(self) -> Optional[int]:
        """This process's rank from the framework's communication package, None before it is initialised."""

    def resolve(self, pending: list) -> Optional[Dict[int, str]]:
        """Writer thread: turn the pending statistics of a batch of records into numbers; id(entry) -> reason
        for the entries that could not be read (logged with their record's name), or None."""

    def resolve_host(self, pending: list) -> list:
        """Training thread, as each record is journaled: fill in place the pending statistics that are already on
        the host (reading them waits for no device) and return the rest, still pending for the writer thread
        (the same list when nothing was filled)."""

    def save_tensor(self, tensor: Any, path: str) -> None:
        """Writer thread: write one tensor file."""

    def make_encoder(self, cfg: Any, tensor_dir: Callable[[], str], writer: Any) -> Encoder: ...

    # Sections of the recorder's own tensor work (threadstate.quiet_sections over tls): hooks pass straight through
    # (busy) while one runs, and the framework's dispatch handling of user code is off (torch: DisableTorchFunction).
    # ``with quiet():`` or, per record, ``sec = quiet.enter()`` ... ``quiet.leave(sec)``.
    quiet: QuietSections

    def install(self, recorder: Any) -> None:
        """Install the global hooks (modules, optimizer steps) that stay for the process's life."""

    def set_api(self, on: bool) -> None:
        """Switch API interception on or off."""

    def models(self, model: Any) -> Iterable[Tuple[Optional[int], Any]]:
        """(index in a list of models or None, model) for start()'s model argument; raises TypeError."""

    def register_model(self, model: Any, index: Optional[int], skip_optimizers: bool) -> None:
        """Name (and where hooks are per object, hook) every submodule of one model."""

    def cannot_record(self) -> Optional[str]:
        """Why nothing can be recorded now (MindSpore's GRAPH_MODE), or None."""

    def token_range(self, token_range: Any) -> Optional[list]:
        """start()'s token_range as this framework supports it (None: every call)."""

    def grad_enabled(self) -> bool:
        """Whether gradients are being recorded for a backward pass now."""

    def grad_leaves(self, value: Any) -> Iterable[Tuple[Any, List[Any]]]:
        """(tensor, path) of the leaves of a save()d value whose gradients can be captured."""

    def on_grad(self, t: Any, hook: Callable[[Any], None]) -> None:
        """Call hook(grad) when t's gradient is computed."""

    def on_step(self) -> None:
        """A step ended: drop per-step caches."""

    def want_module_calls(self) -> None:
        """The recorder needs to see module calls again (``Recorder.module_calls_needed``): hooks an adapter took
        out while nothing needed them are put back."""

    def restore(self) -> None:
        """Remove every hook and wrapper this adapter installed."""
