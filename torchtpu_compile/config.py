"""User-facing settings of the compile path.

Each setting has an environment variable that gives its default at import time; assigning the
attribute at run time wins over the variable.

Example::

    import torchtpu_compile
    torchtpu_compile.config.matmul_precision = "highest"   # fp32 matmuls, even on TPU
    torchtpu_compile.config.strict = True                  # an op that cannot lower is an error
"""
from __future__ import annotations

import os


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


#: "tpu", "cuda" or "cpu"; None picks the best platform present. Read once, when the PJRT
#: client is first needed (env: TORCHTPU_PLATFORM).
platform: str | None = os.environ.get("TORCHTPU_PLATFORM") or None

#: "medium", "high", "highest", or None to follow ``torch.set_float32_matmul_precision`` when the
#: user has set it, and "medium" (the TPU default) otherwise (env: TORCHTPU_MATMUL_PRECISION).
matmul_precision: str | None = os.environ.get("TORCHTPU_MATMUL_PRECISION") or None

#: Make every eager fallback an error naming the op, its shapes and the source line
#: (env: TORCHTPU_STRICT=1).
strict: bool = _env_flag("TORCHTPU_STRICT")
