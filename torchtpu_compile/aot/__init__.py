"""torch.export + ahead-of-time compilation: save a compiled model, load it without compiling.

Example::

    import torchtpu_compile.aot as aot
    aot.compile(model, (tokens,)).save("model.tpu")
    run = aot.load("model.tpu")          # fresh process: a PJRT load, no tracing
    logits = run(tokens)
"""
from .. import runtime  # noqa: F401  (sets XLA's log level before jaxlib first loads)
from .artifact_file import ArtifactError
from .loader import LoadedArtifact, load


def compile(model, example_args=(), example_kwargs=None, precision=None,
            keep_example_inputs=True, dynamic_shapes=None):
    """Export and compile ``model``; see :func:`torchtpu_compile.aot.export.compile`.

    Example::

        batch = torch.export.Dim("batch", min=1, max=64)
        compile(model, (x,), dynamic_shapes=({0: batch},)).save("model.tpu")
    """
    from .export import compile as _compile
    return _compile(model, example_args, example_kwargs, precision, keep_example_inputs,
                    dynamic_shapes)


__all__ = ["ArtifactError", "LoadedArtifact", "compile", "load"]
