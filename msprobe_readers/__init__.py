"""msprobe-dump: readers of msprobe dumps (msprobe-launch's or msprobe's own).

``reading`` finds and streams a dump (every analysis reads through it); ``summary``, ``ranks``, ``diff``,
``stats`` and ``report`` are the analyses; ``text`` formats them for a terminal; ``cli`` is ``msprobe-dump``
and the launcher's end-of-job summary. The dump format itself is ``msprobe_inject.dumpformat``'s.
"""

try:
    from importlib.metadata import PackageNotFoundError, version

    __version__ = version("msprobe-launch")  # the readers ship in the launcher's distribution
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+unknown"
