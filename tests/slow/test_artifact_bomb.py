"""The full-size artifact bomb of tests/test_faults.py: a 1 MiB file whose extra deflated member
inflates to 1 GiB is refused from the zip directory, in a process that stays small."""
import json
import os
import subprocess
import sys
import textwrap
import zipfile

import pytest

from tests.support import aot_factories, python_env
import torchtpu_compile.aot as aot

def add_bomb(src: str, dst: str, inflated: int) -> None:
    """Copy the artifact ``src`` to ``dst`` with a deflated member of ``inflated`` zero bytes,
    written in chunks (this process must not hold it either)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            zout.writestr(name, zin.read(name))
        info = zipfile.ZipInfo("junk.bin")
        info.compress_type = zipfile.ZIP_DEFLATED
        chunk = bytes(16 << 20)
        with zout.open(info, "w", force_zip64=True) as f:
            for _ in range(inflated // len(chunk)):
                f.write(chunk)


@pytest.mark.slow
def test_gigabyte_bomb_is_refused_without_inflating(tmp_path):
    model, (x,) = aot_factories.mlp()
    good = str(tmp_path / "mlp.tpu")
    aot.compile(model, (x,)).save(good)
    bomb = str(tmp_path / "bomb.tpu")
    add_bomb(good, bomb, 1 << 30)
    assert os.path.getsize(bomb) < (4 << 20)
    code = textwrap.dedent("""
        import json, resource, sys
        import torchtpu_compile.aot as aot
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            aot.load(sys.argv[1])
            error = None
        except aot.ArtifactError as exc:
            error = str(exc)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({"error": error, "grew_kib": after - before}))
    """)
    done = subprocess.run([sys.executable, "-c", code, bomb], capture_output=True, text=True,
                          timeout=600, env=python_env())
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["error"] and "junk.bin" in result["error"]
    assert result["grew_kib"] < 256 << 10  # far less than the 1 GiB it would inflate to
