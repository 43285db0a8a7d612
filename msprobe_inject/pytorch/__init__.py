"""msprobe-compatible precision dumping for PyTorch; mirrors ``msprobe.pytorch``."""

from .debugger import (
    PrecisionDebugger,
    module_dump,
    module_dump_end,
    random_save,
    save,
    seed_all,
)

__all__ = ["PrecisionDebugger", "module_dump", "module_dump_end", "random_save", "save", "seed_all"]
