#!/bin/bash
# Prepare this node for training, then hand it to the job watcher (watch-jobs.py), which
# runs the jobs of the stack's job spool in the training container. The gpu-training
# systemd unit runs this on every boot and again after a failure. Exit codes are the
# trainer's (docs/contracts.md section 3): 0 no job left (the node then stops itself), 2
# bad configuration of the node (systemd does not retry), 69 the node failed its health
# gate (the node stops itself), 1 a step here failed (systemd starts it again). A job's
# own exit never ends the watcher: it marks the job and runs the next. GPU
# metrics are published only once the node is ready, so boot, data sync and image pull
# never count as idle.
# Rendered by infra/node/boot.py, which fills in the placeholders.
set -euo pipefail

readonly IMAGE_URI="@@image_uri@@"
readonly REGISTRY="@@registry@@"
readonly REGION="@@region@@"
readonly MIN_DRIVER="@@min_driver@@"
readonly LOG_GROUP="@@log_group@@"
readonly DATA_S3_URI="@@data_s3_uri@@"
readonly DATA_DIR="@@data_dir@@"
readonly CACHE_DIR="@@cache_dir@@"
readonly SCRATCH_DIR="@@scratch_dir@@"
readonly STATE_DIR="@@state_dir@@"
readonly ENV_FILE="@@env_file@@"
readonly JOB_WATCHER="@@job_watcher@@"
readonly GPU_METRICS="@@gpu_metrics@@"
readonly ALERT_TOPIC_ARN="@@alert_topic_arn@@"
readonly EXIT_NODE_UNHEALTHY="@@exit_node_unhealthy@@"
readonly UNHEALTHY_PREFIX="@@unhealthy_prefix@@"
readonly CONTAINER=gpu-training
readonly PULL_RETRY_SECONDS=60

log() { echo "gpu-stack: $*"; }

# The agent's service comes back on every boot by itself: silence it until the job runs.
"$GPU_METRICS" stop || log "could not stop the CloudWatch agent (see above)"

# The AMI brings the kernel driver, the image only the CUDA user space: refuse to
# start an image whose CUDA needs a newer driver than the one actually loaded.
# One line per GPU; read them all (a pipe into head could kill nvidia-smi with SIGPIPE).
mapfile -t drivers < <(nvidia-smi --query-gpu=driver_version --format=csv,noheader)
driver=${drivers[0]:-}
if [ -z "$driver" ]; then
  log "nvidia-smi reported no GPU driver; retrying later"
  exit 1
fi
# Sorted (minimum first, equal allowed) means the driver is new enough. Field by field
# as numbers, a missing field as 0 (-s: no tie-break on the text), as the image's own
# check (training/spec/selfcheck.py) compares: 570.26 = 570.26.00, 580.65.6 = 580.65.06.
if ! printf '%s\n%s\n' "$MIN_DRIVER" "$driver" |
  sort --stable --field-separator=. -k1,1n -k2,2n -k3,3n -k4,4n --check=quiet; then
  log "NVIDIA driver $driver is older than $MIN_DRIVER, the minimum for $IMAGE_URI;" \
    "not starting. Pick an image variant this AMI's driver runs (gpu:imageVariant) or a newer AMI."
  exit 2
fi
log "NVIDIA driver $driver (image needs at least $MIN_DRIVER)"

if [ -n "$DATA_S3_URI" ]; then
  log "syncing $DATA_S3_URI to $DATA_DIR"
  mkdir -p "$DATA_DIR"
  # The aws CLI's own exit codes (2: files skipped) must not reach systemd, where 2
  # means bad configuration and is never retried: a failed sync is tried again.
  if ! aws s3 sync "$DATA_S3_URI" "$DATA_DIR" --region "$REGION" --only-show-errors; then
    log "could not sync $DATA_S3_URI (the aws error is above); retrying later"
    exit 1
  fi
fi

# The stack creates the repository, so on a new stack the image is pushed after the
# nodes boot: wait for it. (A node that waits too long is stopped by the idle alarm.)
until aws ecr get-login-password --region "$REGION" |
  docker login --username AWS --password-stdin "$REGISTRY" &&
  docker pull --quiet "$IMAGE_URI"; do
  log "waiting for $IMAGE_URI to be pushed to the stack's repository; retrying in ${PULL_RETRY_SECONDS}s"
  sleep "$PULL_RETRY_SECONDS"
done
docker rm --force "$CONTAINER" >/dev/null 2>&1 || true

# The image may run as a non-root user: the directories it writes through the bind
# mounts must be that user's. Ask the image (numeric ids, whatever its USER line says).
owner=$(docker run --rm --entrypoint sh "$IMAGE_URI" -c 'echo "$(id -u):$(id -g)"')
install -d -o "${owner%:*}" -g "${owner#*:}" "$STATE_DIR/checkpoints" "$STATE_DIR/output" \
  "$CACHE_DIR"
log "checkpoints and output under $STATE_DIR, the cache $CACHE_DIR belong to the container's user $owner"

docker_args=(
  --name "$CONTAINER"
  --rm
  --gpus all
  --ipc=host
  --env-file "$ENV_FILE"
  --log-driver awslogs
  --log-opt "awslogs-region=$REGION"
  --log-opt "awslogs-group=$LOG_GROUP"
  --log-opt "awslogs-stream=node-0"
  --volume "$SCRATCH_DIR:$SCRATCH_DIR"
  --volume "$STATE_DIR:$STATE_DIR"
)

# The health gate (python -m training health, in the image): GPUs, memory errors, XIDs,
# all-reduce bandwidth against the catalog's figures in the env file. A node that fails it
# never starts the job and is not retried: the alert topic gets the reason and the node
# stops, so a broken node bills no more (a stopped instance is not billed for compute:
# EC2 User Guide, "Stop and start Amazon EC2 instances").
gate_output=$(mktemp)
gate_status=0
docker run --rm --gpus all --ipc=host --env-file "$ENV_FILE" "$IMAGE_URI" \
  python -m training health | tee "$gate_output" || gate_status=$?
reason=$(sed -n "s/^$UNHEALTHY_PREFIX//p" "$gate_output")
rm -f "$gate_output"
if [ "$gate_status" -eq "$EXIT_NODE_UNHEALTHY" ]; then
  log "health gate failed: $reason; stopping this node"
  if [ -n "$ALERT_TOPIC_ARN" ]; then
    aws sns publish --region "$REGION" --topic-arn "$ALERT_TOPIC_ARN" \
      --subject "gpu-stack: node $(hostname) failed its health gate and stops" \
      --message "$reason" >/dev/null || log "could not notify $ALERT_TOPIC_ARN (see above)"
  fi
  shutdown -h now "gpu-stack: node unhealthy" || log "could not stop this node (see above)"
  exit "$EXIT_NODE_UNHEALTHY"
fi
if [ "$gate_status" -ne 0 ]; then
  log "health gate could not run (exit $gate_status); retrying later"
  exit "$gate_status"
fi

# Metrics failing must not stop training: the alarm on missing metrics reports it.
"$GPU_METRICS" start || log "could not start the CloudWatch agent: the idle alarm sees no data"
log "ready: running the jobs of the spool in $IMAGE_URI"
exec python3 "$JOB_WATCHER" "$IMAGE_URI" "${docker_args[@]}"
