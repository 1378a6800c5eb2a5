#!/usr/bin/env bash
# Builds the Dockerfile, unchanged, on a machine with no Docker daemon and no image registry in reach (only Debian's
# and PyPI's mirrors, as on the development machines), then runs deploy/image/smoke.sh inside the image with no
# network. Needs root (it installs Debian's buildah, podman and debootstrap when missing).
#   deploy/build_image_offline.sh [TAG]    (default rag:<commit>; WORK=/var/tmp/rag-image-offline; DEMO=1: rag demo too)
# What differs from a build with a registry, and why:
# - FROM python:3.11-slim-bookworm cannot be pulled: a stand-in is made with debootstrap (Debian bookworm, minbase)
#   with Debian's Python 3.11 (/usr/bin/python via python-is-python3, venv), tagged with that name so FROM finds
#   it. The official image has its own Python build in /usr/local; the Dockerfile's steps are the same.
#   It stays in vfs storage under that name: `podman --storage-driver vfs rmi <name>` before a build with a registry.
# - The stand-in trusts this machine's CA bundle and tells pip to use it (/etc/pip.conf): the mirrors here are
#   reached through a TLS-intercepting proxy. A registry's base image needs neither.
# - PyTorch's CPU index is not in reach: torch's CPU wheel (on this machine's disk, pip finds it) and its
#   dependencies are put in a simple index served on loopback, passed as the Dockerfile's TORCH_INDEX_URL.
# Storage is vfs and RUN steps use chroot isolation: no daemon, no overlay mounts, no user namespaces needed.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TAG=${1:-rag:$(git -C "$ROOT" rev-parse --short HEAD)}
WORK=${WORK:-/var/tmp/rag-image-offline}
BASE=docker.io/library/python:3.11-slim-bookworm
STORE=(--storage-driver vfs)
step() { echo "== $*" >&2; }
[ "$(id -u)" = 0 ] || { echo "run as root: debootstrap, buildah's vfs storage and unshare -n need it" >&2; exit 1; }

if ! command -v buildah >/dev/null || ! command -v podman >/dev/null || ! command -v debootstrap >/dev/null; then
  step "installing Debian's buildah, podman, debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah podman debootstrap >/dev/null
fi
mkdir -p "$WORK"

if ! podman "${STORE[@]}" image exists "$BASE"; then
  step "stand-in for $BASE: Debian bookworm with Debian's Python 3.11"
  rm -rf "$WORK/rootfs"
  debootstrap --variant=minbase --include=python3,python3-venv,python-is-python3,ca-certificates \
    bookworm "$WORK/rootfs" http://deb.debian.org/debian >"$WORK/debootstrap.log"
  cp /etc/ssl/certs/ca-certificates.crt "$WORK/rootfs/etc/ssl/certs/ca-certificates.crt"
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$WORK/rootfs/etc/pip.conf"
  rm -rf "$WORK/rootfs/var/cache/apt/archives/"*.deb
  tar -C "$WORK/rootfs" -c . | podman "${STORE[@]}" import --change 'ENV LANG=C.UTF-8' - "$BASE" >/dev/null
  rm -rf "$WORK/rootfs"
fi

step "torch's CPU wheel and its dependencies in a simple index on loopback"
INDEX=$WORK/torch-index
rm -rf "$INDEX" && mkdir -p "$INDEX/files"
python3 -m pip download --quiet --no-cache-dir -d "$INDEX/files" torch==2.13.0
python3 - "$INDEX" <<'PY'
import re
import sys
import urllib.parse
from pathlib import Path

root = Path(sys.argv[1])
projects: dict[str, list[str]] = {}
for wheel in sorted((root / "files").iterdir()):
    projects.setdefault(re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower(), []).append(wheel.name)
for name, wheels in projects.items():
    page = root / "simple" / name
    page.mkdir(parents=True)
    links = "".join(f'<a href="../../files/{urllib.parse.quote(w)}">{w}</a>\n' for w in wheels)
    (page / "index.html").write_text(links)
print("index:", ", ".join(sorted(projects)))
PY
PORT=$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
python3 -m http.server "$PORT" --bind 127.0.0.1 --directory "$INDEX" >"$WORK/index.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT

step "buildah bud of the committed tree at $(git -C "$ROOT" rev-parse --short HEAD) -> $TAG"
rm -rf "$WORK/context" && mkdir -p "$WORK/context"
git -C "$ROOT" archive HEAD | tar -x -C "$WORK/context"
SECONDS=0
buildah "${STORE[@]}" bud --isolation chroot --network host --pull=never \
  --build-arg TORCH_INDEX_URL="http://127.0.0.1:$PORT/simple" -t "$TAG" "$WORK/context"
step "built in ${SECONDS} s: $(podman "${STORE[@]}" image inspect "$TAG" --format '{{.Size}}') bytes"

# `podman run` needs setrlimit, which a container host may refuse: a buildah working container with chroot isolation
# runs it instead, inside a network namespace of its own (unshare -n) so that nothing can be downloaded.
step "deploy/image/smoke.sh inside $TAG, no network"
CTR=$(buildah "${STORE[@]}" from --pull=never "$TAG")
trap 'kill $SERVER 2>/dev/null || true; buildah "${STORE[@]}" rm "$CTR" >/dev/null 2>&1 || true' EXIT
unshare -n buildah "${STORE[@]}" run --isolation chroot "$CTR" -- python -c "
import socket
try:
    socket.create_connection(('pypi.org', 443), timeout=5)
    raise SystemExit('the smoke test is meant to run without network, and pypi.org answered')
except OSError as error:
    print('no network:', error)
"
unshare -n buildah "${STORE[@]}" run --isolation chroot "$CTR" -- bash deploy/image/smoke.sh
if [ "${DEMO:-0}" = 1 ]; then
  step "rag demo inside $TAG, no network (the main job on the bundled sample corpus)"
  unshare -n buildah "${STORE[@]}" run --isolation chroot "$CTR" -- rag demo
fi
step "OK: the Dockerfile built and its image runs offline"
