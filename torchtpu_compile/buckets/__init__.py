"""Bounded dynamism: padded shape buckets instead of a compile per shape.

A graph whose sizes Dynamo made symbolic is compiled once per bucket, at static padded sizes
(``policy.py`` picks the bucket), with padding masked wherever an op would read it
(``rules.py``); a graph that cannot be made exact under padding is compiled per exact shape and
counted in ``torchtpu_compile.stats()["buckets"]["exact_shape_compiles"]``.

Example::

    import torchtpu_compile
    torchtpu_compile.config.bucket_policy = "multiple-64"
    model = torch.compile(model, backend="torchtpu", dynamic=True)
"""
from .layout import NotPaddable
from .policy import bucket_size, choose
from .runner import BucketedGraph, SizesDiffer

__all__ = ["BucketedGraph", "NotPaddable", "SizesDiffer", "bucket_size", "choose"]
