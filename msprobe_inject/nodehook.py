"""The C++ node hooks (``pytorch/_nodehook.cpp``): built once per torch, cached, loaded by the ranks.

A recorded call registers a hook on an autograd node: an API call one post-hook on the node that made its output,
a module call a pre-hook on each side of its backward capture. Through torch's Python API each registration costs
~16,500 instructions (a ``RemovableHandle``, an ``OrderedDict`` and their wrappers); the extension adds the C++ hook
torch would wrap the callable in, for about a quarter of that (``benchmarks/README.md``).

Its binary is bound to the torch it was compiled against, and a pip build has no torch to compile against, so it
is built where it runs: the launcher calls ``build()`` before any rank starts (a compiler and torch's headers, ~20 s,
once per torch, Python and source), into ``MSPROBE_CACHE_DIR`` (default ``~/.cache/msprobe-launch``), named by a
tag of the three. Ranks never build: ``load()`` imports the cached binary of their own tag (one the user owns and
nobody else can write), or gives None and the hooks go through torch's Python API as before.
``MSPROBE_NODE_HOOK=0`` switches both off.

Torch-free until ``load()``, which imports torch; the compile itself runs in a child process (the launcher never
imports torch). ``python -m msprobe_inject.nodehook`` builds ahead of any launch.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any, Callable, List, Mapping, Optional

from msprobe_inject import envvars

SOURCE = Path(__file__).parent / "pytorch" / "_nodehook.cpp"
_NAME = "_nodehook"
_RETRY_AFTER = 24 * 3600.0  # a failed build is not tried again by every launch (no compiler stays no compiler)


def enabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(envvars.NODE_HOOK, "1").strip().lower() not in ("0", "false", "no", "off")


def cache_root(environ: Optional[Mapping[str, str]] = None) -> Path:
    env = os.environ if environ is None else environ
    given = env.get(envvars.CACHE_DIR)
    if given:
        return Path(given)
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "msprobe-launch"


def _torch_version_file() -> Optional[Path]:
    spec = importlib.util.find_spec("torch")  # finds the package without importing it
    if spec is None or not spec.origin:
        return None
    f = Path(spec.origin).parent / "version.py"
    return f if f.is_file() else None


def tag() -> Optional[str]:
    """What the binary is bound to: torch (its version file: version, git commit, CUDA), the interpreter's ABI and
    the source. None without torch."""
    vf = _torch_version_file()
    if vf is None:
        return None
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), vf.read_bytes(), sys.version.encode(),
                 str(sysconfig.get_config_var("EXT_SUFFIX")).encode(), platform.machine().encode()):
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:20]


def binary_path(the_tag: str, environ: Optional[Mapping[str, str]] = None) -> Path:
    # setuptools names the binary it builds by EXT_SUFFIX, which the interpreter imports
    return cache_root(environ) / "nodehook" / the_tag / f"{_NAME}{sysconfig.get_config_var('EXT_SUFFIX')}"


def _only_mine(path: Path) -> bool:
    """The binary and its directory are this user's and nobody else may write them: a binary another user could
    replace is code of theirs that every rank would run."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    for p in (path, path.parent):
        st = os.stat(p, follow_symlinks=False)
        if (uid is not None and st.st_uid != uid) or st.st_mode & 0o022:
            return False
    return True


def load(the_tag: Optional[str] = None) -> Optional[Any]:
    """The built extension of this torch, or None (not built, switched off, or not the binary of this tag)."""
    try:
        if not enabled():
            return None
        the_tag = the_tag or tag()
        if the_tag is None:
            return None
        path = binary_path(the_tag)
        if not path.is_file() or not _only_mine(path):
            return None
        import torch  # noqa: F401  (its libraries, which the binary links against, and its Python types)

        spec = importlib.util.spec_from_file_location(_NAME, path)
        if spec is None or spec.loader is None:
            return None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        if getattr(mod, "TAG", None) != the_tag:
            return None
        return mod
    except Exception:  # a binary that does not load is a binary not built: the Python API serves
        return None


def build(timeout: float = 900.0, environ: Optional[Mapping[str, str]] = None,
          announce: Optional[Callable[[str], None]] = None) -> str:
    """Build the extension of this torch into the cache unless it is there (``announce`` is told before it
    compiles). Returns what happened, for one line of the launcher's: "" (built before, switched off, or failed
    within the last day), "built in N s", or why it was not built."""
    env = dict(os.environ if environ is None else environ)
    if not enabled(env):
        return ""
    the_tag = tag()
    if the_tag is None:
        return ""
    final = binary_path(the_tag, env)
    if final.is_file():
        return ""
    failed = final.parent / "failed.txt"
    try:
        if time.time() - failed.stat().st_mtime < _RETRY_AFTER:
            return ""
    except OSError:
        pass
    work = final.parent / f"build-{platform.node()}-{os.getpid()}"
    if announce is not None:
        announce(f"compiling the C++ node hooks for this torch into {final.parent} (once per torch; "
                 f"{envvars.NODE_HOOK}=0 skips it)")
    # the compiler's process is no rank: none of the job's MSPROBE_* reaches it, and it never dumps
    child_env = {k: v for k, v in env.items() if not k.startswith("MSPROBE_")}
    child_env[envvars.ENABLE] = "0"
    t0 = time.monotonic()
    try:
        final.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        os.chmod(final.parent, 0o755)  # whatever the umask: load() takes no binary that others could replace
        shutil.rmtree(work, ignore_errors=True)
        proc = subprocess.run([sys.executable, "-m", "msprobe_inject.nodehook", "--compile", str(work), the_tag],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, env=child_env)
        built = work / final.name
        if proc.returncode != 0 or not built.is_file():
            tail = proc.stdout.decode("utf-8", "replace").strip().splitlines()[-12:]
            raise RuntimeError(f"exit code {proc.returncode}: " + " | ".join(tail))
        os.chmod(built, 0o755)
        os.replace(built, final)  # atomic: launchers of other nodes sharing the cache each put a whole binary
        return f"built in {time.monotonic() - t0:.0f} s"
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        try:
            failed.write_text(reason + "\n", encoding="utf-8")
        except OSError:
            pass
        return f"not built ({reason[:300]}); see {failed}"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _compile(out_dir: str, the_tag: str) -> None:
    from setuptools import Distribution
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    ext = CppExtension(_NAME, [str(SOURCE)],
                       extra_compile_args=["-O2", "-g0", f'-DMSPROBE_NODEHOOK_TAG="{the_tag}"'])
    dist = Distribution({"name": "msprobe-nodehook", "ext_modules": [ext],
                         "cmdclass": {"build_ext": BuildExtension.with_options(use_ninja=False)}})
    cmd = dist.get_command_obj("build_ext")
    cmd.build_lib = out_dir
    cmd.build_temp = os.path.join(out_dir, "tmp")
    cmd.ensure_finalized()
    cmd.run()


def main(argv: List[str]) -> int:
    """``python -m msprobe_inject.nodehook``: build into the cache ahead of any launch (an image's build step, a
    cluster's shared cache), as the launcher would; exit code 1 where it cannot be built."""
    if argv[:1] == ["--compile"]:  # build()'s child
        _compile(argv[1], argv[2])
        return 0
    said = build(announce=lambda what: print(what, flush=True))
    the_tag = tag()
    path = binary_path(the_tag) if the_tag else None
    if path is not None and path.is_file():
        print(f"{said or 'built before'}: {path}")
        return 0
    print(said or ("switched off" if not enabled() else "no torch" if the_tag is None
                   else f"not built: a failed build is not retried for a day ({path.parent / 'failed.txt'})"))
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
