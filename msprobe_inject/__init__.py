"""Runtime that lives inside each rank: config, session, hooks, statistics and writers.

Importing this package does not import torch or mindspore.
"""

__version__ = "0.1.0"
