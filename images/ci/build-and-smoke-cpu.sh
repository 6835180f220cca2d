#!/usr/bin/env bash
# Build the cpu image for real and run a short training job inside it (this repository's CI).
#
# Needs root, buildah and debootstrap (Debian: apt-get install buildah debootstrap), network
# access to Debian's archive and PyPI, and a CPU torch wheel of the matrix's version in
# WHEELHOUSE (default: /opt/wheels). Fails loudly when any of that is missing: it never
# skips. Prints the time each stage took and the image's size.
set -euo pipefail

cd "$(dirname "$0")/../.."
# The project's virtualenv (make bootstrap) has what `python -m images` imports.
if [ -z "${PYTHON:-}" ]; then
    PYTHON=python3
    [ -x .venv/bin/python ] && PYTHON=.venv/bin/python
fi
WHEELHOUSE=${WHEELHOUSE:-/opt/wheels}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
# overlay shares the image's layers with each container (the smoke step starts several);
# vfs copies the whole root filesystem for every container and commit, minutes for a
# 1.5 GB image. vfs where the kernel cannot mount overlay here (e.g. inside a container
# whose own root is overlayfs), or where the storage already holds another driver's images.
overlay_works() {
    local container
    container=$(buildah --storage-driver overlay from scratch 2>/dev/null) || return 1
    buildah --storage-driver overlay mount "$container" >/dev/null 2>&1 || {
        buildah --storage-driver overlay rm "$container" >/dev/null 2>&1; return 1; }
    buildah --storage-driver overlay rm "$container" >/dev/null 2>&1
}
if [ -z "${STORAGE_DRIVER:-}" ]; then
    STORAGE_DRIVER=vfs
    [ "$(id -u)" = 0 ] && command -v buildah >/dev/null && overlay_works && STORAGE_DRIVER=overlay
fi
echo "build-and-smoke-cpu: storage driver $STORAGE_DRIVER"
WORKDIR=${WORKDIR:-build/smoke-cpu}

fail() { echo "build-and-smoke-cpu: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "must run as root (buildah with the $STORAGE_DRIVER driver, debootstrap)"
for tool in buildah debootstrap; do
    command -v "$tool" >/dev/null || fail "$tool is not installed (apt-get install $tool)"
done
ls "$WHEELHOUSE"/torch-*+cpu-*.whl >/dev/null 2>&1 || fail "no CPU torch wheel in $WHEELHOUSE"
ca_args=()
[ -f "$CA_BUNDLE" ] && ca_args=(--ca-bundle "$CA_BUNDLE")

started=$SECONDS
stage() {
    local name=$1; shift
    local t0=$SECONDS
    echo "== $name"
    "$@"
    echo "== $name: $((SECONDS - t0)) s"
}
stage "bootstrap Debian base" \
    "$PYTHON" -m images bootstrap-base cpu --storage-driver "$STORAGE_DRIVER"
stage "build cpu image" \
    "$PYTHON" -m images build cpu --engine buildah --storage-driver "$STORAGE_DRIVER" \
    --wheelhouse "$WHEELHOUSE" "${ca_args[@]}"
stage "smoke: versions, 2-rank ZeRO-2 job without op builds, Slurm-style run, SIGTERM -> 75" \
    "$PYTHON" -m images smoke cpu --storage-driver "$STORAGE_DRIVER" --workdir "$WORKDIR"
# Earlier builds' images lose their tag to this one: drop them, keep the new image.
buildah --storage-driver "$STORAGE_DRIVER" rmi --prune >/dev/null || true
echo "build-and-smoke-cpu: OK in $((SECONDS - started)) s"
