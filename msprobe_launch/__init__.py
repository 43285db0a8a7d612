"""msprobe-launch: a torchrun-compatible launcher with zero-code msprobe dumping in every rank."""

try:
    from importlib.metadata import PackageNotFoundError, version

    __version__ = version("msprobe-launch")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+unknown"
