#!/bin/bash
# Assemble this node's instance-store NVMe drives into one RAID0 array mounted at
# the scratch directory. Instance store is wiped whenever the instance stops (a spot
# interruption stops it), so systemd runs this before every start of the training
# unit: after a reboot the array is assembled again, after a stop it is re-created.
# Rendered by infra/node/boot.py, which fills in the placeholders.
set -euo pipefail

readonly SCRATCH_DIR="@@scratch_dir@@"
readonly EXPECTED_DRIVES="@@instance_store_drives@@"
readonly ARRAY=/dev/md/scratch
readonly SYS_BLOCK=/sys/block

log() { echo "gpu-stack scratch: $*"; }

mkdir -p "$SCRATCH_DIR"
if mountpoint -q "$SCRATCH_DIR"; then
  log "$SCRATCH_DIR is already mounted"
  exit 0
fi

drives=()
for model in "$SYS_BLOCK"/nvme*n1/device/model; do
  [ -e "$model" ] || continue
  if grep -q "Instance Storage" "$model"; then
    block=${model%/device/model}
    drives+=("/dev/${block##*/}")
  fi
done

if [ "${#drives[@]}" -eq 0 ]; then
  log "no instance-store NVMe drive found (catalog says $EXPECTED_DRIVES); $SCRATCH_DIR stays on the root volume"
  exit 0
fi
if [ "${#drives[@]}" -ne "$EXPECTED_DRIVES" ]; then
  log "found ${#drives[@]} instance-store drives, the catalog says $EXPECTED_DRIVES; using what is there"
fi

if ! command -v mdadm >/dev/null; then
  log "installing mdadm"
  if command -v dnf >/dev/null; then dnf install -y mdadm
  elif command -v yum >/dev/null; then yum install -y mdadm
  else apt-get install -y mdadm
  fi
fi

if mdadm --assemble "$ARRAY" "${drives[@]}" 2>/dev/null; then
  log "assembled the existing array from ${#drives[@]} drives"
else
  log "creating a RAID0 array over ${drives[*]}"
  mdadm --create "$ARRAY" --run --force --level=0 --raid-devices="${#drives[@]}" "${drives[@]}"
fi
if ! blkid "$ARRAY" >/dev/null 2>&1; then
  # Lazy init: the filesystem is usable at once instead of after zeroing terabytes.
  mkfs.ext4 -q -F -L scratch -E lazy_itable_init=1,lazy_journal_init=1,nodiscard "$ARRAY"
fi
mount -o noatime "$ARRAY" "$SCRATCH_DIR"
log "mounted $ARRAY at $SCRATCH_DIR ($(df -h --output=size "$SCRATCH_DIR" | tail -n 1 | tr -d ' '))"
