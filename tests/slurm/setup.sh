#!/usr/bin/env bash
# Starts a private single-node Slurm on this machine for the Slurm spec:
# its own munged (own key and socket), slurmctld and slurmd, all with their
# state, logs and pid files under $MONARCH_SLURM_DIR (default
# /tmp/monarch-slurm), on ports that do not clash with a system Slurm.
# Nothing under /etc is touched; clients find it through SLURM_CONF
# ($MONARCH_SLURM_DIR/slurm.conf). Needs root (slurmd runs jobs as their
# users).
#   tests/slurm/setup.sh [OWNER_PID]
# Several test runs may share it: each passes its pid as OWNER_PID and
# tests/slurm/stop.sh OWNER_PID stops the Slurm only when no owner is left
# alive. Without OWNER_PID (by hand) it stays up until stop.sh without one.
# Idempotent: if that Slurm already answers it only registers the owner.
# Prints 'started' or 'already running' on stdout. Exit codes: 0 ready,
# 2 cannot run here (not root, Slurm or munge missing), 1 started but did
# not come up (the logs are printed).
set -u
D=${MONARCH_SLURM_DIR:-/tmp/monarch-slurm}
READY_TIMEOUT=40          # seconds for the node to show up idle
CTLD_PORT=${MONARCH_SLURM_CTLD_PORT:-16817}   # not Slurm's 6817: a system Slurm may run here
SLURMD_PORT=${MONARCH_SLURM_SLURMD_PORT:-16818}
LOCK_TIMEOUT=60           # seconds to wait for another run's setup or stop
export SLURM_CONF=$D/slurm.conf
OWNER=${1:-manual}

say() { echo "slurm-setup: $*" >&2; }

[ "$(id -u)" -eq 0 ] || { say "needs root (slurmd runs jobs as their users)"; exit 2; }
for c in munged munge unmunge slurmctld slurmd sinfo sbatch srun scontrol; do
  command -v "$c" >/dev/null 2>&1 || { say "'$c' not found (apt-get install slurmd slurmctld slurm-client munge)"; exit 2; }
done
id munge >/dev/null 2>&1 || { say "no 'munge' user (install the munge package)"; exit 2; }
command -v flock >/dev/null 2>&1 || { say "'flock' not found (util-linux)"; exit 2; }

# One setup or stop at a time; the lock is released when this script exits
# (the daemons are started with fd 9 closed, so they do not keep it).
exec 9>"$D.lock"
flock -w "$LOCK_TIMEOUT" 9 || { say "$D.lock is held by another run for ${LOCK_TIMEOUT}s"; exit 1; }
register() { mkdir -p "$D/owners" && touch "$D/owners/$OWNER"; }

node_state() { sinfo -h -N -o %T 2>/dev/null | head -1; }

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# Up: the node takes jobs (idle) or runs another test run's job.
node_up() { case "$(node_state)" in idle* | mixed* | allocated* | completing*) return 0 ;; esac; return 1; }

if alive "$D/slurmctld.pid" && alive "$D/slurmd.pid" && node_up; then
  register
  echo "slurm-setup: already running ($SLURM_CONF)"
  exit 0
fi

# A half-started earlier run: stop it first (we hold the lock: no waiting).
MONARCH_SLURM_LOCKED=1 "$(dirname "$0")/stop.sh" >/dev/null 2>&1

NODE=$(hostname -s)
# Job ids that an earlier run of this Slurm did not hand out, so a leftover
# process of an old job is never taken for one of the new ones.
FIRST_JOB=$(( ($(date +%s) % 60000) * 1000 + 1 ))
CPUS=$(nproc)
mkdir -p "$D"/{state,spool,log,munge,munge-run}
chmod 0755 "$D"

# munge: a fresh key readable by the munge user only, and a socket of our own.
chown munge:munge "$D/munge" "$D/munge-run"
chmod 0700 "$D/munge"
chmod 0755 "$D/munge-run"
if [ ! -s "$D/munge/munge.key" ]; then
  dd if=/dev/urandom of="$D/munge/munge.key" bs=1024 count=1 status=none || { say "cannot write the munge key"; exit 1; }
fi
chown munge:munge "$D/munge/munge.key"
chmod 0400 "$D/munge/munge.key"
SOCK=$D/munge-run/munge.socket
runuser -u munge -- munged --socket="$SOCK" --key-file="$D/munge/munge.key" \
  --pid-file="$D/munge-run/munged.pid" --log-file="$D/munge/munged.log" --seed-file="$D/munge/munged.seed" 9>&- ||
  { say "munged did not start:"; tail -5 "$D/munge/munged.log" >&2; exit 1; }
if ! munge -S "$SOCK" -n </dev/null | unmunge -S "$SOCK" >/dev/null 2>&1; then
  say "munge does not round-trip a credential"; exit 1
fi

cat >"$SLURM_CONF" <<CONF
# Written by tests/slurm/setup.sh: one node, everything under $D.
ClusterName=monarchtest
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCK
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
JobRequeue=0
FirstJobId=$FIRST_JOB
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=60
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN
PartitionName=monarch Nodes=$NODE Default=YES MaxTime=10 State=UP
CONF

slurmctld -f "$SLURM_CONF" -i 9>&- ||
  { say "slurmctld did not start:"; tail -20 "$D/log/slurmctld.log" >&2; exit 1; }
slurmd -f "$SLURM_CONF" -N "$NODE" 9>&- ||
  { say "slurmd did not start:"; tail -20 "$D/log/slurmd.log" >&2; exit 1; }

for _ in $(seq 1 $((READY_TIMEOUT * 2))); do
  st=$(node_state)
  if [ "$st" = idle ]; then register; echo "slurm-setup: started ($SLURM_CONF)"; exit 0; fi
  if [ "$st" = down ] || [ "$st" = drained ]; then scontrol update nodename="$NODE" state=resume >/dev/null 2>&1; fi
  sleep 0.5
done
say "the node did not become idle within ${READY_TIMEOUT}s (state '$(node_state)'); logs:"
tail -15 "$D/log/slurmctld.log" "$D/log/slurmd.log" >&2
exit 1
