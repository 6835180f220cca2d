#!/bin/bash
# Start or stop publishing GPU utilisation to CloudWatch (once a minute): the guardrails'
# idle alarm stops the node when it stays low. run-training.sh starts it right before the
# training container and stops it at its own start, so only a running job is measured.
# Usage: gpu-metrics.sh start|stop
# Rendered by infra/node/boot.py, which fills in the placeholders.
set -euo pipefail

readonly AGENT_CONFIG="@@agent_config@@"
readonly AGENT_CTL=/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl
readonly UBUNTU_PACKAGE=https://amazoncloudwatch-agent.s3.amazonaws.com/ubuntu/amd64/latest/amazon-cloudwatch-agent.deb

log() { echo "gpu-stack metrics: $*"; }

case "${1:-}" in
  stop)
    if [ -x "$AGENT_CTL" ]; then "$AGENT_CTL" -a stop -m ec2; fi
    exit 0
    ;;
  start) ;;
  *)
    echo "usage: $0 start|stop" >&2
    exit 64
    ;;
esac

if [ ! -x "$AGENT_CTL" ]; then
  log "installing the CloudWatch agent"
  if command -v dnf >/dev/null; then
    dnf install -y amazon-cloudwatch-agent
  elif command -v yum >/dev/null; then
    yum install -y amazon-cloudwatch-agent
  else
    package=$(mktemp --suffix=.deb)
    curl --fail --silent --show-error --location --output "$package" "$UBUNTU_PACKAGE"
    dpkg -i "$package"
    rm -f "$package"
  fi
fi
"$AGENT_CTL" -a fetch-config -m ec2 -s -c "file:$AGENT_CONFIG"
log "CloudWatch agent publishing GPU metrics"
