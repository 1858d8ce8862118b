"""Every bench still imports: a bench names the modules it drives, and a module that moves
must not leave a bench that fails before its first line of work (benches are not run by
the suite, so nothing else would notice)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

IMPORT_ALL = """
import importlib.util, sys, traceback
failed = []
sys.path.insert(0, sys.argv[1].rsplit("/", 1)[0])  # as when run: the bench folder first
for path in sys.argv[1:]:
    name = path.rsplit("/", 1)[-1][:-3]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception:
        failed.append(path + ": " + traceback.format_exc().splitlines()[-1])
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_every_bench_imports() -> None:
    benches = sorted(str(p) for p in (ROOT / "bench").glob("*.py"))
    assert len(benches) > 10
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL, *benches], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
