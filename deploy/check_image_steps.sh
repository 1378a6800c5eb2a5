#!/usr/bin/env bash
# Runs the Dockerfile's Python steps where no image builder works (no Docker daemon, no base image to pull): a copy
# of this checkout's committed files, a clean venv, deploy/image/install-python.sh in the Dockerfile's two phases,
# then what each process of the image runs, offline (deploy/image/smoke.sh): the code location loads, the launcher
# and executor packages import, the CLIs answer, and the bundled models encode without a download.
#   deploy/check_image_steps.sh [WORK_DIR]     (default: a new temp dir, removed at the end unless KEEP=1)
# It does not run the Dockerfile's apt-get line (tesseract, libgomp1 come from the machine here) nor build layers.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${1:-$(mktemp -d /var/tmp/rag-image-check.XXXXXX)}
[ -n "${1:-}" ] || [ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$WORK"' EXIT
SRC=$WORK/src
VENV=$WORK/venv
step() { echo "== $*" >&2; }

step "copy of the committed tree at $(git -C "$ROOT" rev-parse --short HEAD) (what COPY . . takes, less .dockerignore)"
rm -rf "$SRC" && mkdir -p "$SRC"
git -C "$ROOT" archive HEAD | tar -x -C "$SRC"

step "clean venv ($(python3 --version))"
rm -rf "$VENV" && python3 -m venv "$VENV"
PY=$VENV/bin/python

step "RUN install-python.sh --deps-only"
( cd "$SRC" && bash deploy/image/install-python.sh "$PY" --deps-only )
step "RUN install-python.sh --project-only"
( cd "$SRC" && bash deploy/image/install-python.sh "$PY" --project-only )

# The image's environment (Dockerfile ENV), with a data dir of its own.
export PATH=$VENV/bin:$PATH HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 GX_ANALYTICS_ENABLED=false \
  DAGSTER_DISABLE_TELEMETRY=1 RAG_DATA_DIR=$WORK/data DAGSTER_HOME=$WORK/dagster_home
unset QDRANT_URL MLFLOW_TRACKING_URI MLFLOW_REGISTRY_URI RAG_ONNX_CACHE
mkdir -p "$RAG_DATA_DIR" "$DAGSTER_HOME"
cd "$SRC"

bash deploy/image/smoke.sh
step "OK: every Python step of the Dockerfile ran in a clean venv ($(du -sh "$VENV" | cut -f1))"
