"""msprobe-compatible precision dumping for MindSpore (PyNative); mirrors ``msprobe.mindspore``."""

from .debugger import PrecisionDebugger, seed_all
from .single_save import save, save_grad, step

__all__ = ["PrecisionDebugger", "save", "save_grad", "seed_all", "step"]
