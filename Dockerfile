# syntax=docker/dockerfile:1
# One image for every process of a deployment: the Dagster code location (`dagster api grpc`), the daemon and the
# webserver, the run workers (Kubernetes Jobs, Celery workers) and `rag serve`. Everything the code loads is inside:
# CPU torch, the Python packages, and the models from their PyPI packages; nothing is downloaded at run time
# (HF_HUB_OFFLINE). Build: docker build -t rag:$(git rev-parse --short HEAD) .
# Its Python steps are deploy/image/install-python.sh, the script `make install` runs; deploy/check_image_steps.sh
# runs them in a clean venv where no image builder is at hand (docs/operations.md#deployment).
FROM python:3.11-slim-bookworm

# tesseract: OCR of scanned PDF pages (rag/parsing/ocr.py); libgomp1: LightGBM's and torch's CPU threads.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tesseract-ocr tesseract-ocr-eng libgomp1 \
    && rm -rf /var/lib/apt/lists/*

# PyTorch's CPU wheels (a plain `pip install torch` on Linux takes the CUDA build, several GB).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    GX_ANALYTICS_ENABLED=false \
    DAGSTER_DISABLE_TELEMETRY=1 \
    RAG_DATA_DIR=/data \
    DAGSTER_HOME=/opt/dagster/dagster_home

WORKDIR /opt/rag
# Dependencies first: a code change rebuilds only the layers below.
COPY requirements.txt setup.py ./
COPY packaging/en_core_web_sm_alias ./packaging/en_core_web_sm_alias
COPY deploy/image/install-python.sh ./deploy/image/install-python.sh
RUN python -m venv /opt/venv \
    && TORCH_INDEX_URL=$TORCH_INDEX_URL bash deploy/image/install-python.sh /opt/venv/bin/python --deps-only \
    && rm -rf /root/.cache/pip

COPY . .
RUN bash deploy/image/install-python.sh /opt/venv/bin/python --project-only \
    && mkdir -p /data "$DAGSTER_HOME" \
    && python -c "import orchestration.definitions"

# The code server by default (Dagster's Helm chart passes its own arguments); compose and the chart start the
# daemon, the webserver, Celery workers and `rag serve` from this same image with their own commands.
EXPOSE 3030 8000
CMD ["dagster", "api", "grpc", "-h", "0.0.0.0", "-p", "3030", "-m", "orchestration.definitions"]
