#!/bin/bash
# ParallelCluster runs this once on each node it has configured (CustomActions,
# OnNodeConfigured; the stack uploads it to its bucket). Arguments (infra/cluster/config.py):
#   head JOB_SCRIPT_S3_URI EPILOG_S3_URI
#       the head node: Pyxis on, the job script and the Epilog in place
#   compute REGISTRY REGION LOGIN NODE_VERDICTS_DIR
#       a compute node: Enroot on, pulling from the stack's ECR as LOGIN; the GPU hook's
#       nvidia-container-cli; the folder where jobs leave verdicts for the Epilog
# Pyxis and Enroot come installed on ParallelCluster's official AMIs since 3.11.0
# and are off by default since 3.11.1 (aws-parallelcluster CHANGELOG); the AMI
# ships the configuration that turns them on under /opt/parallelcluster/examples
# (the paths AWS's awsome-distributed-training post-install script copies).
set -euo pipefail

# The filesystem root: "" on a node; tests run the script inside a temporary folder.
readonly ROOT=${SETUP_NODE_ROOT:-}
readonly EXAMPLES=$ROOT/opt/parallelcluster/examples
readonly JOB_SCRIPT=/opt/gpu-stack/train.sbatch
# slurm.conf on ParallelCluster runs every script here as the Epilog (Epilog=/opt/slurm/
# etc/scripts/epilog.d/*: aws-parallelcluster-cookbook, aws-parallelcluster-slurm/templates/
# default/slurm/slurm.conf.erb, commit f75d84c38ecfac1891e5f3e8fe2d424cc3e7448d); slurmd
# expands the pattern each time it runs the Epilog (SchedMD/slurm, prep_script_slurmd.c,
# _script_list_create), and /opt/slurm is shared with the compute nodes.
readonly EPILOG=$ROOT/opt/slurm/etc/scripts/epilog.d/90-gpu-stack-node-verdicts
readonly SCRATCH=/scratch
readonly ENROOT_CONF=$ROOT/etc/enroot/enroot.conf
# Enroot's user configuration folder, where it reads the registry credentials
# ($ENROOT_CONFIG_PATH/.credentials: enroot doc/cmd/import.md, "Credentials"), one for every
# user. Not /etc/enroot: that is Enroot's system configuration folder (ENROOT_SYSCONF_PATH),
# and Enroot runs the hooks, mounts and environment files of both folders
# (src/runtime.sh, hook_dirs, mount_dirs, environ_dirs, tag v3.4.1), so the same folder
# twice runs every hook, the NVIDIA one among them, twice on each container.
readonly ENROOT_USER_CONFIG=/etc/gpu-stack/enroot
# Where Enroot keeps images, container roots and per-user runtime files, and where it
# unpacks each layer before making an image (ENROOT_TEMP_PATH, default ${TMPDIR:-/tmp}:
# enroot.in; common::mktmpdir in docker::import): all on the node's scratch disk (its NVMe
# instance store), not the root volume, which a multi-GB image fills.
# $(id -u) and $(id -g) are left for Enroot to expand, for each user.
# shellcheck disable=SC2016 # expanded by Enroot, not here
readonly ENROOT_SETTINGS=(
  'ENROOT_RUNTIME_PATH /run/enroot/user-$(id -u)'
  "ENROOT_CACHE_PATH $SCRATCH/enroot/cache/group-\$(id -g)"
  "ENROOT_DATA_PATH $SCRATCH/enroot/data/user-\$(id -u)"
  "ENROOT_TEMP_PATH $SCRATCH/enroot/tmp"
  "ENROOT_CONFIG_PATH $ENROOT_USER_CONFIG"
)
# Enroot's NVIDIA hook (hooks.d/98-nvidia.sh) runs for every image that sets
# NVIDIA_VISIBLE_DEVICES, as the stack's does, and fails with "Command not found:
# nvidia-container-cli" without it (tag v3.4.1; NVIDIA/pyxis issues 101 and 110).
# Enroot's package only suggests libnvidia-container-tools and ParallelCluster's cookbook
# installs no part of it, so the node setup does, from NVIDIA's repository, as its
# installation guide says ("With apt: Ubuntu, Debian": https://docs.nvidia.com/datacenter/
# cloud-native/container-toolkit/latest/install-guide.html), at a pinned version.
readonly NVIDIA_CONTAINER_VERSION=1.17.8-1
readonly NVIDIA_REPOSITORY=https://nvidia.github.io/libnvidia-container
readonly NVIDIA_KEYRING=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg

log() { echo "gpu-stack: $*"; }
fail() {
  echo "gpu-stack: $*" >&2
  exit 1
}

# Enroot keeps the first value it reads for a setting (config::export: ${!1:-$2}), from
# enroot.conf and then enroot.conf.d/*.conf, and a variable already in the environment
# wins over both (NVIDIA/enroot enroot.in, config::load and config::init, commit
# 8ea147d337da60cb1c557140f3a85cdf0d620968). So each of these settings is removed from
# the example config before it is written once: one value, whatever the reading order.
configure_enroot() {
  local keys=() setting
  for setting in "${ENROOT_SETTINGS[@]}"; do keys+=("${setting%% *}"); done
  local pattern
  pattern=$(IFS='|' && echo "${keys[*]}")
  grep -Ev "^[[:space:]]*($pattern)([[:space:]=]|\$)" "$EXAMPLES/enroot/enroot.conf" >"$ENROOT_CONF"
  printf '%s\n' "${ENROOT_SETTINGS[@]}" >>"$ENROOT_CONF"
  # Enroot creates each user's own folder under these with umask 077 (enroot.in, after
  # the configuration), so their parents must let every user create one: world-writable
  # and sticky, as /tmp. /run/enroot is not created by ParallelCluster's AMI.
  install -d -m 1777 "$ROOT/run/enroot" "$ROOT$SCRATCH/enroot/cache" \
    "$ROOT$SCRATCH/enroot/data" "$ROOT$SCRATCH/enroot/tmp"
  install -d -m 0755 "$ROOT$ENROOT_USER_CONFIG"
}

ensure_nvidia_container_cli() {
  if ! command -v nvidia-container-cli >/dev/null; then
    log "installing libnvidia-container-tools $NVIDIA_CONTAINER_VERSION for Enroot's GPU hook"
    install -d -m 0755 "$(dirname "$ROOT$NVIDIA_KEYRING")" "$ROOT/etc/apt/sources.list.d"
    curl -fsSL "$NVIDIA_REPOSITORY/gpgkey" | gpg --batch --yes --dearmor -o "$ROOT$NVIDIA_KEYRING"
    # $(ARCH) is apt's, expanded to the node's architecture.
    # shellcheck disable=SC2016
    printf 'deb [signed-by=%s] %s/stable/deb/$(ARCH) /\n' "$NVIDIA_KEYRING" "$NVIDIA_REPOSITORY" \
      >"$ROOT/etc/apt/sources.list.d/nvidia-container-toolkit.list"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      "libnvidia-container-tools=$NVIDIA_CONTAINER_VERSION" \
      "libnvidia-container1=$NVIDIA_CONTAINER_VERSION"
  fi
  # What the hook does with it needs the driver to answer; a node where it cannot fails
  # here, in one line, not in every job's first srun.
  if ! nvidia-container-cli info >/dev/null 2>&1; then
    fail "nvidia-container-cli cannot read this node's GPUs (nvidia-container-cli info" \
      "failed): Enroot cannot start the image's containers here"
  fi
}

role=${1:?usage: setup-node.sh head JOB_SCRIPT_S3_URI EPILOG_S3_URI | compute REGISTRY REGION LOGIN NODE_VERDICTS_DIR}
case "$role" in
  head)
    job_script_uri=${2:?the S3 URI of the job script}
    epilog_uri=${3:?the S3 URI of the Epilog}
    # /opt/slurm is shared with the compute nodes: one plugstack for all of them.
    # container_scope=job: a job's named container (--container-name) is its own and is
    # removed when the job ends; Pyxis's default keeps it for every later job of the user
    # on the node (NVIDIA/pyxis config.c, container_scope, SCOPE_GLOBAL, tag v0.20.0).
    mkdir -p "$ROOT/opt/slurm/etc/plugstack.conf.d"
    cp "$EXAMPLES/spank/plugstack.conf" "$ROOT/opt/slurm/etc/plugstack.conf"
    sed -E '/^[[:space:]]*(required|optional)[[:space:]]/{/container_scope=/!s/[[:space:]]*$/ container_scope=job/}' \
      "$EXAMPLES/pyxis/pyxis.conf" >"$ROOT/opt/slurm/etc/plugstack.conf.d/pyxis.conf"
    mkdir -p "$(dirname "$ROOT$JOB_SCRIPT")" "$(dirname "$EPILOG")"
    aws s3 cp --only-show-errors "$job_script_uri" "$ROOT$JOB_SCRIPT"
    aws s3 cp --only-show-errors "$epilog_uri" "$EPILOG"
    chmod 0755 "$EPILOG"
    systemctl restart slurmctld
    log "Pyxis enabled, the node-verdicts Epilog in place; submit with: sbatch $JOB_SCRIPT --config FILE.toml"
    ;;
  compute)
    registry=${2:?the ECR registry}
    region=${3:?the region}
    login=${4:?the registry login}
    verdicts=${5:?the node verdicts folder}
    configure_enroot
    # Enroot runs the command on each import, so the 12-hour ECR token is always new
    # (https://github.com/NVIDIA/enroot/blob/master/doc/cmd/import.md, "Credentials").
    # shellcheck disable=SC2016 # expanded by Enroot, not here
    printf 'machine %s login %s password $(aws ecr get-login-password --region %s)\n' \
      "$registry" "$login" "$region" >"$ROOT$ENROOT_USER_CONFIG/.credentials"
    chmod 0644 "$ROOT$ENROOT_USER_CONFIG/.credentials"
    # Every user may leave a file, none may list or remove another's (infra/cluster/epilog.py).
    install -d -m 1733 "$ROOT$verdicts"
    ensure_nvidia_container_cli
    log "Enroot pulls from $registry as $login"
    ;;
  *)
    echo "setup-node.sh: unknown role $role (head or compute)" >&2
    exit 2
    ;;
esac
