#!/usr/bin/env bash
# Make room for a CUDA image build on a GitHub-hosted Ubuntu runner: Docker's data root,
# and with it BuildKit's state (the buildx container's volume), moves to the runner's
# large temporary volume, and the toolchains the build never uses are deleted from /.
#
# ubuntu-24.04 runners: / has about 14-20 GB free after the preinstalled toolchains,
# /mnt (the VM's temporary disk) about 66 GB; /usr/local/.ghcup (Haskell) holds ~5.5 GB,
# /usr/local/lib/android ~10 GB, /usr/share/dotnet ~2 GB (actions/runner-images,
# images/ubuntu/Ubuntu2404-Readme.md). Prints the free space before and after.
set -euo pipefail

DATA_ROOT=${DATA_ROOT:-/mnt/docker}

df -h / /mnt
sudo rm -rf /usr/share/dotnet /usr/local/lib/android /opt/ghc /usr/local/.ghcup \
    /opt/hostedtoolcache/CodeQL /usr/local/share/boost
sudo docker image prune --all --force >/dev/null

# The runner's daemon.json carries settings of its own: add data-root to them.
config=/etc/docker/daemon.json
merged=$(mktemp)
{ sudo cat "$config" 2>/dev/null || true; } \
    | jq -s --arg root "$DATA_ROOT" '(.[0] // {}) + {"data-root": $root}' > "$merged"
sudo systemctl stop docker.socket docker.service
sudo install -d -m 710 "$DATA_ROOT"
sudo install -m 644 "$merged" "$config"
sudo systemctl start docker.service
test "$(docker info --format '{{.DockerRootDir}}')" = "$DATA_ROOT"
df -h / /mnt
