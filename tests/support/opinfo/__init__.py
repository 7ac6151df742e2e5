"""PyTorch's OpInfo database run against torchtpu's two paths, compared with eager CPU.

- ``paths``: how one sample runs on a path (``compile``: ``torch.compile(backend="torchtpu")``;
  ``eager``: the ``tpu`` device), and what it used besides XLA.
- ``skips``: the skip list, as data: entry -> (category, reason).
- ``harness``: one OpInfo entry, one path, one dtype -> a ``Result``.
- ``modules``: one ModuleInfo entry (PyTorch's ``module_db``), one path, fp32 -> a ``Result``:
  outputs, gradients and the module's state after the call.
- ``errors``: PyTorch's error inputs (OpInfo's and ModuleInfo's) of one entry on one path:
  where eager CPU raises, the path must raise the same type (``sweep --errors``).
- ``sweep``: every entry (of ``op_db``, or ``module_db`` with ``--db modules``), crash-isolated
  in worker processes, into a results JSON.
- ``report``: docs/coverage.md from the results JSON (and the model zoo's).
"""
