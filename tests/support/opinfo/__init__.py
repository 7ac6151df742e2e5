"""PyTorch's OpInfo database run against torchtpu's two paths, compared with eager CPU.

- ``paths``: how one sample runs on a path (``compile``: ``torch.compile(backend="torchtpu")``;
  ``eager``: the ``tpu`` device), and what it used besides XLA.
- ``skips``: the skip list, as data: entry -> (category, reason).
- ``harness``: one OpInfo entry, one path, one dtype -> a ``Result``.
- ``sweep``: every entry, crash-isolated in worker processes, into a results JSON.
- ``report``: docs/coverage.md from the results JSON (and the model zoo's).
"""
