#!/usr/bin/env bash
# Stops the private Slurm that tests/slurm/setup.sh started (by the pids in
# its pid files, or by the config and socket paths only it uses) and removes
# its state. Safe to run twice.
#   tests/slurm/stop.sh [OWNER_PID]
# With OWNER_PID: forgets that owner and stops only if no other owner is
# still alive and nobody started it by hand. Without: stops it regardless.
set -u
D=${MONARCH_SLURM_DIR:-/tmp/monarch-slurm}
STOP_WAIT=10      # seconds a daemon gets to exit after SIGTERM
LOCK_TIMEOUT=60   # seconds to wait for another run's setup or stop
OWNER=${1:-}

if [ -z "${MONARCH_SLURM_LOCKED:-}" ]; then # setup.sh calls us with the lock held
  exec 9>"$D.lock"
  flock -w "$LOCK_TIMEOUT" 9 || { echo "slurm-stop: $D.lock is held by another run" >&2; exit 1; }
fi
if [ -n "$OWNER" ] && [ -d "$D" ]; then
  rm -f "$D/owners/$OWNER"
  for f in "$D"/owners/*; do
    [ -e "$f" ] || continue
    o=$(basename "$f")
    if [ "$o" = manual ] || kill -0 "$o" 2>/dev/null; then
      echo "slurm-stop: still used by $o"
      exit 0
    fi
    rm -f "$f" # that run died without stopping
  done
fi

stop() { # pidfile
  [ -f "$1" ] || return 0
  local pid
  pid=$(cat "$1")
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 1 $((STOP_WAIT * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  fi
  rm -f "$1"
}
stop "$D/slurmd.pid"
stop "$D/slurmctld.pid"
stop "$D/munge-run/munged.pid"
# Daemons whose pid files went missing (their directory removed under them):
# found by the config and socket paths only this Slurm uses.
for pat in "slurmd -f $D/slurm.conf" "slurmctld -f $D/slurm.conf" "munged --socket=$D/munge-run/"; do
  for pid in $(pgrep -f -- "^$pat"); do
    kill -TERM "$pid" 2>/dev/null
  done
done
rm -rf "$D"
echo "slurm-stop: stopped"
