"""A package, so that tests import their shared code as ``tests.support`` (see support/)."""
