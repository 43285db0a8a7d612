"""Step boundaries seen through torch's global optimizer hooks: where zero-code runs end a step, and the
``optimizer`` parent of construct.json at level mix."""

from __future__ import annotations

from ..recorder import Recorder
from .apis import ApiHooks


class OptimizerHooks:
    def __init__(self, rec: Recorder, apis: ApiHooks):
        self.rec = rec
        self.apis = apis
        self.handles: list = []

    def install(self) -> None:
        from torch.optim import optimizer as om

        self.handles.append(om.register_optimizer_step_pre_hook(self._pre))
        self.handles.append(om.register_optimizer_step_post_hook(self._post))

    def restore(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def _pre(self, optimizer, args, kwargs) -> None:
        self.apis.optimizer_running = True
        rec = self.rec
        if rec.level == "mix" and rec.session.running:
            try:
                rec.place("optimizer", None)
            except Exception as exc:
                rec.log(f"optimizer pre-hook failed: {type(exc).__name__}: {exc}")

    def _post(self, optimizer, args, kwargs) -> None:
        self.apis.optimizer_running = False
        self.rec.step_boundary("optimizer")
