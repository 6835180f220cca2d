#!/bin/bash
# Give the job fast scratch space at the scratch directory, before every start of the
# training unit. Never fatal: whatever goes wrong, the job still runs, with scratch on
# the root volume, and the reason is in the console log.
#
# - A Deep Learning AMI that has already put the instance-store drives into LVM and
#   mounted them (dlami-nvme.service, mount point @@dlami_nvme_dir@@: DLAMI release notes,
#   "nvme_location") is used as it is: bind-mounted at the scratch directory.
# - Otherwise the instance-store NVMe drives are assembled into one RAID0 array.
#   Instance store is wiped whenever the instance stops (a spot interruption stops
#   it): after a reboot the array is assembled again, after a stop it is re-created.
# Rendered by infra/node/boot.py, which fills in the placeholders.
set -uo pipefail

readonly SCRATCH_DIR="@@scratch_dir@@"
readonly DLAMI_NVME_DIR="@@dlami_nvme_dir@@"
readonly EXPECTED_DRIVES="@@instance_store_drives@@"
readonly ARRAY=/dev/md/scratch
readonly SYS_BLOCK=/sys/block

log() { echo "gpu-stack scratch: $*"; }

assemble_instance_store() {
  local drives=() model block
  for model in "$SYS_BLOCK"/nvme*n1/device/model; do
    [ -e "$model" ] || continue
    if grep -q "Instance Storage" "$model"; then
      block=${model%/device/model}
      drives+=("/dev/${block##*/}")
    fi
  done
  if [ "${#drives[@]}" -eq 0 ]; then
    log "no instance-store NVMe drive found (catalog says $EXPECTED_DRIVES); $SCRATCH_DIR stays on the root volume"
    return 0
  fi
  if [ "${#drives[@]}" -ne "$EXPECTED_DRIVES" ]; then
    log "found ${#drives[@]} instance-store drives, the catalog says $EXPECTED_DRIVES; using what is there"
  fi
  if ! command -v mdadm >/dev/null; then
    log "installing mdadm"
    if command -v dnf >/dev/null; then dnf install -y mdadm || return 1
    elif command -v yum >/dev/null; then yum install -y mdadm || return 1
    else apt-get install -y mdadm || return 1
    fi
  fi
  if mdadm --assemble "$ARRAY" "${drives[@]}" 2>/dev/null; then
    log "assembled the existing array from ${#drives[@]} drives"
  else
    log "creating a RAID0 array over ${drives[*]}"
    mdadm --create "$ARRAY" --run --force --level=0 --raid-devices="${#drives[@]}" "${drives[@]}" ||
      return 1
  fi
  if ! blkid "$ARRAY" >/dev/null 2>&1; then
    # Lazy init: the filesystem is usable at once instead of after zeroing terabytes.
    mkfs.ext4 -q -F -L scratch -E lazy_itable_init=1,lazy_journal_init=1,nodiscard "$ARRAY" ||
      return 1
  fi
  mount -o noatime "$ARRAY" "$SCRATCH_DIR" || return 1
  log "mounted $ARRAY at $SCRATCH_DIR ($(df -h --output=size "$SCRATCH_DIR" | tail -n 1 | tr -d ' '))"
}

mkdir -p "$SCRATCH_DIR"
if mountpoint -q "$SCRATCH_DIR"; then
  log "$SCRATCH_DIR is already mounted"
elif mountpoint -q "$DLAMI_NVME_DIR"; then
  if mount --bind "$DLAMI_NVME_DIR" "$SCRATCH_DIR"; then
    log "using the AMI's instance-store volume $DLAMI_NVME_DIR as $SCRATCH_DIR"
  else
    log "could not bind $DLAMI_NVME_DIR to $SCRATCH_DIR; $SCRATCH_DIR stays on the root volume"
  fi
elif ! assemble_instance_store; then
  log "setting up the instance store failed (see above); $SCRATCH_DIR stays on the root volume"
fi
exit 0
