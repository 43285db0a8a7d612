"""The dump format, in one place: what msprobe 26.2 writes and what we add to it.

Torch-free and framework-free, so that the writer inside a rank, the crash recovery, the launcher and
the readers all import the same definitions and declare nothing of their own:

* ``paths``: every file and directory name of a dump (``step{N}/rank{R}/dump.json`` ...), built and parsed;
* ``names``: record names (``Functional.linear.0.forward``, ``Module.fc1.Linear.forward.0``,
  ``Cell.fc1.Dense.parameters_grad.0``), built and parsed, for ``Module.`` and ``Cell.`` alike;
* ``nonfinite``: the one test for a NaN/Inf statistic;
* ``encoding``: the JSON encoder every record body goes through (once);
* ``entry``: a tensor's entry as the encoder's C holds it (C values, ``_entry.h``), read in Python as its dict;
* ``documents``: one step's records and the documents made from them (dump.json, stack.json, construct.json);
* ``journal``: the append-only record log of a rank directory, its replay, completeness and recovery;
* ``files``: how files and directories are created (modes, no symlink followed, atomic replace).
"""
