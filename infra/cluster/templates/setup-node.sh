#!/bin/bash
# ParallelCluster runs this once on each node it has configured (CustomActions,
# OnNodeConfigured; the stack uploads it to its bucket). Arguments:
#   head JOB_SCRIPT_S3_URI      the head node: Pyxis on, the job script in place
#   compute REGISTRY REGION     a compute node: Enroot on, pulls from the stack's ECR
# Pyxis and Enroot come installed on ParallelCluster's official AMIs since 3.11.0
# and are off by default since 3.11.1 (aws-parallelcluster CHANGELOG); the AMI
# ships the configuration that turns them on under /opt/parallelcluster/examples
# (the paths AWS's awsome-distributed-training post-install script copies).
set -euo pipefail

# The filesystem root: "" on a node; tests run the script inside a temporary folder.
readonly ROOT=${SETUP_NODE_ROOT:-}
readonly EXAMPLES=$ROOT/opt/parallelcluster/examples
readonly JOB_SCRIPT=/opt/gpu-stack/train.sbatch
readonly SCRATCH=/scratch
readonly ENROOT_CONF=$ROOT/etc/enroot/enroot.conf
# Where Enroot keeps images, container roots and per-user runtime files, and where it
# reads the registry credentials ($ENROOT_CONFIG_PATH/.credentials). Images and roots on
# the node's scratch disk, not the root volume; one credentials file for every user.
# $(id -u) and $(id -g) are left for Enroot to expand, for each user.
# shellcheck disable=SC2016 # expanded by Enroot, not here
readonly ENROOT_SETTINGS=(
  'ENROOT_RUNTIME_PATH /run/enroot/user-$(id -u)'
  "ENROOT_CACHE_PATH $SCRATCH/enroot/cache/group-\$(id -g)"
  "ENROOT_DATA_PATH $SCRATCH/enroot/data/user-\$(id -u)"
  'ENROOT_CONFIG_PATH /etc/enroot'
)

log() { echo "gpu-stack: $*"; }

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
  install -d -m 1777 "$ROOT/run/enroot" "$ROOT$SCRATCH/enroot/cache" "$ROOT$SCRATCH/enroot/data"
}

role=${1:?usage: setup-node.sh head JOB_SCRIPT_S3_URI | compute REGISTRY REGION}
case "$role" in
  head)
    # /opt/slurm is shared with the compute nodes: one plugstack for all of them.
    mkdir -p /opt/slurm/etc/plugstack.conf.d
    cp "$EXAMPLES/spank/plugstack.conf" /opt/slurm/etc/plugstack.conf
    cp "$EXAMPLES/pyxis/pyxis.conf" /opt/slurm/etc/plugstack.conf.d/pyxis.conf
    systemctl restart slurmctld
    mkdir -p "$(dirname "$JOB_SCRIPT")"
    aws s3 cp --only-show-errors "${2:?the S3 URI of the job script}" "$JOB_SCRIPT"
    log "Pyxis enabled; submit with: sbatch $JOB_SCRIPT --config FILE.toml"
    ;;
  compute)
    registry=${2:?the ECR registry}
    region=${3:?the region}
    configure_enroot
    # Enroot runs the command on each import, so the 12-hour ECR token is always new
    # (https://github.com/NVIDIA/enroot/blob/master/doc/cmd/import.md, "Credentials").
    # shellcheck disable=SC2016 # expanded by Enroot, not here
    printf 'machine %s login AWS password $(aws ecr get-login-password --region %s)\n' \
      "$registry" "$region" >"$ROOT/etc/enroot/.credentials"
    chmod 0644 "$ROOT/etc/enroot/.credentials"
    log "Enroot pulls from $registry"
    ;;
  *)
    echo "setup-node.sh: unknown role $role (head or compute)" >&2
    exit 2
    ;;
esac
