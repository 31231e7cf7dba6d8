#!/bin/sh
# Container entrypoint of eldr-node (deploy/docker/Dockerfile).
#
# CAF 0.17.6 derives its node id from the MAC addresses, the root filesystem's UUID (read from
# /etc/fstab) and the PID. Two containers running eldr-node as PID 1 with the same MAC addresses
# (the same image on different hosts, or copies of one network namespace) would get the same
# node id and could not join one cluster. Writing a fresh random UUID for "/" into this
# container's own /etc/fstab makes every container's node id distinct. Then eldr-node replaces
# this shell (exec: it stays PID 1 and receives SIGTERM directly).
set -eu

if uuid=$(cat /proc/sys/kernel/random/uuid 2>/dev/null) && [ -n "$uuid" ]; then
  if ! echo "UUID=$uuid / ext4 defaults 0 1" >/etc/fstab 2>/dev/null; then
    echo "eldr-entrypoint: cannot write /etc/fstab; CAF node ids may collide" >&2
  fi
else
  echo "eldr-entrypoint: no /proc/sys/kernel/random/uuid; CAF node ids may collide" >&2
fi

# Arguments that start with "-" are eldr-node's; anything else is a command to run instead
# (docker run eldr:latest eldrctl --node tcp://... status).
case "${1:-}" in
  "" | -*) exec /usr/bin/eldr-node "$@" ;;
  *) exec "$@" ;;
esac
