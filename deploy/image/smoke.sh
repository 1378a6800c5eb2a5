#!/usr/bin/env bash
# What each process of the image runs, checked offline where the image's environment is: the code location loads,
# torch is the CPU build, the launcher and executor packages import, the commands answer, the bundled models encode
# without a download, Tesseract answers. Run from the source root with the environment's python first on PATH:
# deploy/check_image_steps.sh runs it in a clean venv, deploy/build_image_offline.sh inside the built image.
set -euo pipefail
step() { echo "== $*" >&2; }

step "the image's smoke test: the code location loads"
python -c "import orchestration.definitions"
step "torch is the CPU build; torchvision is absent"
python -c "import importlib.util, torch; assert not torch.cuda.is_available(); \
assert importlib.util.find_spec('torchvision') is None; print('torch', torch.__version__)"
step "launcher and executor packages of the shipped instance configs"
python -c "import dagster_k8s, dagster_celery, dagster_postgres, redis; print('dagster-k8s', dagster_k8s.__version__, \
'dagster-celery', dagster_celery.__version__)"
RAG_EXECUTOR=celery python -c "from orchestration.definitions import defs; print('executor', defs.executor.name)"
step "the commands the deployment starts"
dagster --version
dagster-celery --help >/dev/null
dagster-webserver --help >/dev/null
dagster-daemon --help >/dev/null
rag serve --help >/dev/null
step "Tesseract (OCR of scanned pages)"
tesseract --version 2>&1 | head -1
step "the bundled models load and encode offline"
python - <<'PY'
from pathlib import Path

import spacy

from rag.embedding import load_embedder
from rag.llm.gguf_models import resolve_gguf

for name in ("minilm", "wordllama"):
    print(name, "encodes to", load_embedder(name).encode(["a question about the deployment"]).shape)
print("smollm2 weights", resolve_gguf("smollm2", Path("/nonexistent")).stat().st_size, "bytes")
print("spaCy", spacy.load("en_core_web_sm").meta["name"])
PY
