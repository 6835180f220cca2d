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

readonly EXAMPLES=/opt/parallelcluster/examples
readonly JOB_SCRIPT=/opt/gpu-stack/train.sbatch
readonly SCRATCH=/scratch

log() { echo "gpu-stack: $*"; }

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
    cp "$EXAMPLES/enroot/enroot.conf" /etc/enroot/enroot.conf
    # Images and container roots on the node's scratch disk, not the root volume;
    # one credentials file for every user, read when Enroot imports an image.
    mkdir -p "$SCRATCH/enroot"
    chmod 1777 "$SCRATCH/enroot"
    # ${USER} is left for Enroot to expand, for each user.
    {
      echo "ENROOT_CACHE_PATH $SCRATCH/enroot/cache/\${USER}"
      echo "ENROOT_DATA_PATH $SCRATCH/enroot/data/\${USER}"
      echo "ENROOT_CONFIG_PATH /etc/enroot"
    } >>/etc/enroot/enroot.conf
    # Enroot runs the command on each import, so the 12-hour ECR token is always new
    # (https://github.com/NVIDIA/enroot/blob/master/doc/cmd/import.md, "Credentials").
    # shellcheck disable=SC2016 # expanded by Enroot, not here
    printf 'machine %s login AWS password $(aws ecr get-login-password --region %s)\n' \
      "$registry" "$region" >/etc/enroot/.credentials
    chmod 0644 /etc/enroot/.credentials
    log "Enroot pulls from $registry"
    ;;
  *)
    echo "setup-node.sh: unknown role $role (head or compute)" >&2
    exit 2
    ;;
esac
