#!/usr/bin/env bash
# Stop the local test cluster started by slurm/start.sh: cancel every job, then each daemon by its pidfile
# (SIGTERM, then SIGKILL after a wait).
#   bash slurm/stop.sh [STATE_DIR]    # default /tmp/klsweep-slurm
set -uo pipefail

STATE="${1:-/tmp/klsweep-slurm}"
if [ -f "$STATE/slurm.conf" ]; then
    export SLURM_CONF="$STATE/slurm.conf"
    timeout 10 scancel --full --user="$(id -un)" >/dev/null 2>&1 || true
fi

stop_pidfile() {
    local pidfile="$1" pid
    [ -e "$pidfile" ] || return 0
    pid="$(cat "$pidfile" 2>/dev/null || true)"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 40); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.25
        done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    fi
    rm -f "$pidfile"
}

for d in slurmd slurmctld slurmdbd mariadbd munged; do
    stop_pidfile "$STATE/run/$d.pid"
done
# munged leaves its pidfile in /run/munge when it was started by an earlier state folder.
stop_pidfile /run/munge/munged.pid
echo "slurm/stop.sh: stopped"
