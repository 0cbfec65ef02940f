#!/usr/bin/env bash
# The sandbox's container engine on a Debian host (run as root; idempotent): podman with
# runc, debootstrap for the base image, and a containers.conf drop-in for hosts like CI's.
# Then `vfops sandbox build-image` builds the base image (skipped when it is there).
set -euo pipefail
missing=()
for tool in podman runc debootstrap; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q podman runc debootstrap >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q podman runc debootstrap >/dev/null; }
fi
# crun (podman's default runtime) refuses hosts with hybrid cgroups, and a container's
# default rlimits cannot be set where the host forbids raising them: runc and no default
# ulimits work on both kinds of host (the limits vfops sets are cgroup limits)
mkdir -p /etc/containers/containers.conf.d
conf=/etc/containers/containers.conf.d/50-vfops-sandbox.conf
want='[containers]
default_ulimits = []

[engine]
runtime = "runc"'
if [ "$(cat "$conf" 2>/dev/null)" != "$want" ]; then
  printf '%s\n' "$want" > "$conf"
fi
podman info >/dev/null
