"""The one runtime: a PJRT client per process, buffer conversion, compiled executables."""
import os

# XLA's C++ INFO lines ("PjRt-IFRT device count ...") are noise for PyTorch users; this must be
# set before jaxlib is first loaded. An explicit setting by the user wins.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
