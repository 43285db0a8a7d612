"""Build hooks and the optional C statistics kernel (metadata lives in pyproject.toml).

Ships ``msprobe_launch.pth`` into site-packages, the startup hook of the env-only form
(``MSPROBE_DUMP_PATH=./d torchrun ... train.py`` without the launcher). It works like coverage.py's
``a1_coverage.pth``: one line that does nothing unless an MSPROBE_* variable asks for dumping.
Regular wheels get it through build_py; PEP 660 editable wheels never run our build_py output through
install_lib, so the file is added to the editable wheel (and its RECORD) after it is built.
The name sorts after ``__editable__*.pth``, so the package is importable when the line runs.
"""

import base64
import hashlib
import os
import zipfile
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

PTH_NAME = "msprobe_launch.pth"
PTH_CODE = (
    "import os, sys; exec(\"e = os.environ.get('MSPROBE_ENABLE', '')\\n"
    "if (os.environ.get('MSPROBE_DUMP_PATH') or os.environ.get('MSPROBE_CONFIG') or e)"
    " and e.strip().lower() not in ('0', 'false', 'no', 'off'):\\n"
    " try:\\n  from msprobe_inject._boot.bootstrap import startup;"
    " startup('pth')\\n except Exception as e:\\n"
    "  sys.stderr.write('[msprobe-launch] warning: startup hook failed: %r\\\\n' % (e,))\")\n"
)


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):
            Path(self.build_lib, PTH_NAME).write_text(PTH_CODE, encoding="utf-8")

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if not getattr(self, "editable_mode", False):
            outputs.append(os.path.join(self.build_lib, PTH_NAME))
        return outputs


def _add_pth_to_wheel(wheel_path: str) -> None:
    data = PTH_CODE.encode("utf-8")
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record_line = f"{PTH_NAME},sha256={digest},{len(data)}\n".encode()
    tmp = wheel_path + ".tmp"
    with zipfile.ZipFile(wheel_path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            if item.filename == PTH_NAME:
                continue
            payload = src.read(item.filename)
            if item.filename.endswith(".dist-info/RECORD"):
                payload += record_line
            dst.writestr(item, payload)
        dst.writestr(PTH_NAME, data)
    os.replace(tmp, wheel_path)


class BuildExtO3(build_ext):
    """-O3 for the statistics kernel: distributions' default -O2 may leave its loop unvectorised. For the kernel, no
    contraction of a multiplication and an addition into one fused operation (a compiler's default where the
    instruction set has it: its AVX-512 clone, aarch64): it would change the last bits of a sum of squares from one
    CPU to another."""

    def build_extensions(self):
        if self.compiler.compiler_type == "unix":
            for ext in self.extensions:
                exact = ["-ffp-contract=off"] if ext.name == FASTATS.name else []
                ext.extra_compile_args = [*ext.extra_compile_args, "-O3", *exact]
        super().build_extensions()


cmdclass = {"build_py": BuildPyWithPth, "build_ext": BuildExtO3}
# optional: without a C compiler the package installs and reduces with torch alone
FASTATS = Extension("msprobe_inject._fastats", ["msprobe_inject/_fastats.c"],
                    depends=["msprobe_inject/dumpformat/_entry.h"], optional=True)
# the journal's append in one call (the training thread journals every record)
JPUT = Extension("msprobe_inject.dumpformat._jput", ["msprobe_inject/dumpformat/_jput.c"],
                 depends=["msprobe_inject/dumpformat/_entry.h", "msprobe_inject/_attrs.h",
                          "msprobe_inject/_stacksig.h"], optional=True)
# each record body's JSON text into one buffer (the writer thread encodes every record)
JENC = Extension("msprobe_inject.dumpformat._jenc", ["msprobe_inject/dumpformat/_jenc.c"],
                 depends=["msprobe_inject/dumpformat/_entry.h"], optional=True)
# the signature of a recorded call's stack (the writer looks each record's stack up by it)
STACKSIG = Extension("msprobe_inject._stacksig", ["msprobe_inject/_stacksig.c"], depends=["msprobe_inject/_stacksig.h"],
                     optional=True)
# the hooks' per-thread state, read and set about twenty times per recorded call
TSTATE = Extension("msprobe_inject._tstate", ["msprobe_inject/_tstate.c"], depends=["msprobe_inject/_tstate.h"],
                   optional=True)
# a recorded API call's common case without the interpreter frames of the dump mode's hook (every listed call)
APICALL = Extension("msprobe_inject.pytorch._apicall", ["msprobe_inject/pytorch/_apicall.c"],
                    depends=["msprobe_inject/_attrs.h", "msprobe_inject/_tstate.h"], optional=True)
# msprobe-dump index: a dump.json's index rows column-wise, without a Python object per JSON value
JROWS = Extension("msprobe_readers._jrows", ["msprobe_readers/_jrows.c"], optional=True)

try:
    from setuptools.command.editable_wheel import editable_wheel
except ImportError:  # setuptools < 64: no PEP 660 editable installs
    editable_wheel = None

if editable_wheel is not None:

    class EditableWheelWithPth(editable_wheel):
        def run(self):
            super().run()
            wheels = sorted(Path(self.dist_dir).glob("*.whl"), key=os.path.getmtime)
            if wheels:
                _add_pth_to_wheel(str(wheels[-1]))

    cmdclass["editable_wheel"] = EditableWheelWithPth

setup(cmdclass=cmdclass, ext_modules=[FASTATS, JPUT, JENC, STACKSIG, TSTATE, APICALL, JROWS])
