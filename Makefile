# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv and install first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Reinstall when any input of the environment changes.
STAMP := $(VENV)/.installed-$(shell cat Makefile requirements.txt setup.py packaging/en_core_web_sm_alias/setup.py deploy/image/install-python.sh 2>/dev/null | sha256sum | cut -c1-12)
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export GX_ANALYTICS_ENABLED ?= false
export DAGSTER_DISABLE_TELEMETRY ?= 1
export RAG_DATA_DIR ?= $(CURDIR)/data
export DAGSTER_HOME ?= $(RAG_DATA_DIR)/dagster

.PHONY: install demo test lint test-all dev mlflow validate bench bench-quick bench-training bench-training-quick clean browser ocr services

$(PY):
	$(PYTHON) -m venv $(VENV)

# The same steps build the Docker image (Dockerfile): CPU torch from disk first, requirements, the models' packages.
$(STAMP): $(PY) requirements.txt setup.py deploy/image/install-python.sh
	bash deploy/image/install-python.sh $(PY)
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP) ocr

demo: install
	$(VENV)/bin/rag demo

# $(call apt_install,PACKAGES,WHAT IS MISSED WITHOUT THEM): Debian packages as root or through sudo; a note when
# neither is possible or apt fails (no commas inside the arguments).
apt_install = if [ "$$(id -u)" = 0 ]; then AS=; elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then AS=sudo; else AS=none; fi; \
	  if [ "$$AS" = none ]; then echo "note: $(1) is missing and there is no root/sudo: $(2) (apt-get install $(1))"; \
	  else $$AS apt-get install -y -qq $(1) >/dev/null 2>&1 || { $$AS apt-get update -qq && $$AS apt-get install -y -qq $(1) >/dev/null; } \
	    || echo "note: installing Debian's $(1) failed: $(2)"; fi

# The web page's test drives Debian's chromium through Playwright (no `playwright install` download).
browser:
	@[ -x /usr/bin/chromium ] || { $(call apt_install,chromium,tests/test_web_ui.py will be skipped); }

# PDF pages without a text layer (scans) are read by Debian's Tesseract (rag/parsing/ocr.py); without it such PDFs
# are quarantined as no-text-layer and tests/test_ocr.py is skipped.
ocr:
	@{ command -v tesseract >/dev/null && tesseract --list-langs 2>/dev/null | grep -qx eng; } || { \
	  $(call apt_install,tesseract-ocr tesseract-ocr-eng,scanned PDF pages will not be read (quarantined as no-text-layer)); }

# The database tests' servers: Debian's PostgreSQL (the feedback store and instance-config tests) and Redis (the
# Celery executor test). deploy/ci/services.sh starts a throwaway cluster and a Redis on 127.0.0.1 (reused when
# already running) and prints RAG_TEST_POSTGRES_URL / RAG_TEST_REDIS_URL for the tests; without them those tests
# are skipped, each saying why.
services:
	@ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || { $(call apt_install,postgresql,the Postgres tests will be skipped); }
	@command -v redis-server >/dev/null || { $(call apt_install,redis-server,the Celery executor test will be skipped); }

# One worker per core: most tests wait on one thread (model loads, subprocesses, SQLite), so two share 2 cores well.
TEST_WORKERS ?= 2
test: install browser lint services
	eval "$$(bash deploy/ci/services.sh)"; $(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

lint: install
	$(VENV)/bin/ruff check .

test-all: install browser services
	eval "$$(bash deploy/ci/services.sh)"; $(PY) -m pytest -q

validate: install
	$(VENV)/bin/dagster definitions validate -w workspace.yaml

# `rag instance-config` (as `rag demo` does first) adds deploy/dagster-local.yaml to $(DAGSTER_HOME)/dagster.yaml:
# runs that open the embedded Qdrant folder queue behind one another instead of failing with QdrantLockedError.
dev: install
	$(VENV)/bin/rag instance-config
	$(VENV)/bin/dagster dev -w workspace.yaml

# The MLflow UI on the embedded store (rag.registry): training runs, registered versions, aliases, served on
# 127.0.0.1:5000. The store is made first as the registry makes it (a migrated copy holding the registered
# models), so the UI never creates a bare one. With MLFLOW_TRACKING_URI set, open that server's own UI instead.
# The address printed is the one Dagster's links use (RAG_MLFLOW_UI_URL, e.g. a proxy in front of this server).
mlflow: install
	$(PY) -c "from rag.registry import ModelRegistry; from rag.registry.tracking import mlflow_ui_url; \
	  r = ModelRegistry(); r.mlflow_client(); print(f'MLflow UI: {mlflow_ui_url(r)} (links from Dagster open it)')"
	$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///$(RAG_DATA_DIR)/models/mlflow.db \
	  --default-artifact-root $(RAG_DATA_DIR)/models/mlartifacts --host 127.0.0.1 --port 5000 --workers 1

bench: install
	$(PY) bench/run.py

bench-quick: install
	$(PY) bench/run.py --quick

# Trained models on SciFact with paired tests; each writes bench/results/training-scifact[-quick].json itself.
bench-training: install
	$(PY) bench/training.py

bench-training-quick: install
	$(PY) bench/training.py --quick

# Renders every figure of docs/ (and README.md's figure blocks) from bench/results/*.json; standard library only,
# so it needs no .venv. tests/test_docs.py fails when a committed page differs from this render.
.PHONY: docs
docs:
	$(PYTHON) docs/render.py

clean:
	rm -rf $(VENV) data
