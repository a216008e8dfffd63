#!/usr/bin/env bash
# Start a single-node Slurm cluster with accounting on this machine, for klsweep's integration tests and CI.
#   bash slurm/install.sh            # once: the Debian packages
#   bash slurm/start.sh [STATE_DIR]  # default /tmp/klsweep-slurm; rerunnable (stops a running one first)
#   source STATE_DIR/env.sh          # exports SLURM_CONF for sbatch/sacct/submitit
#   bash slurm/stop.sh [STATE_DIR]
# Runs as root, needs no systemd. Every config, state, log and pid file lives in STATE_DIR (munged keeps
# Debian's /run/munge socket, which Slurm's auth/munge uses by default).
# Environment: KLSWEEP_SLURM_DB_PORT (MariaDB on 127.0.0.1, default 3307).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="${1:-/tmp/klsweep-slurm}"
DB_PORT="${KLSWEEP_SLURM_DB_PORT:-3307}"
DB_PASS="klsweep"

if [ "$(id -u)" -ne 0 ]; then
    echo "slurm/start.sh: run as root (the test cluster runs its daemons as root)" >&2
    exit 1
fi
for bin in slurmctld slurmd slurmdbd munged mariadbd mariadb-install-db sinfo sacct; do
    command -v "$bin" >/dev/null || { echo "slurm/start.sh: $bin missing: run bash slurm/install.sh" >&2; exit 1; }
done

bash "$HERE/stop.sh" "$STATE" >/dev/null 2>&1 || true

mkdir -p "$STATE"/{log,spool/ctld,spool/d,run}
STATE="$(cd "$STATE" && pwd)"
DB="$STATE/mysql"
# The node's CPUs as slurmd detects them (not `nproc`: it honours OMP_NUM_THREADS, and a cluster started under
# OMP_NUM_THREADS=1 has one CPU: every 2-task job then pends for ever, reason PartitionConfig).
CPUS="$(slurmd -C 2>/dev/null | sed -n 's/.* CPUs=\([0-9][0-9]*\) .*/\1/p' | head -n 1)"
[ -n "$CPUS" ] || CPUS="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)"
MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))

# --- munge -------------------------------------------------------------------------------------------------
[ -s /etc/munge/munge.key ] || { mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null \
    || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none; }
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
chmod 755 /run/munge
rm -f /run/munge/munged.pid /run/munge/munge.socket.2*
runuser -u munge -- munged --pid-file=/run/munge/munged.pid
ln -sf /run/munge/munged.pid "$STATE/run/munged.pid"

# --- MariaDB (accounting storage) --------------------------------------------------------------------------
if [ ! -d "$DB/mysql" ]; then
    mkdir -p "$DB" && chown mysql:mysql "$DB"
    mariadb-install-db --user=mysql --datadir="$DB" --auth-root-authentication-method=socket \
        --skip-test-db >"$STATE/log/mariadb-install.log" 2>&1
fi
chown -R mysql:mysql "$DB"
setsid runuser -u mysql -- mariadbd --no-defaults --datadir="$DB" --socket="$DB/mysqld.sock" \
    --pid-file="$DB/mysqld.pid" --log-error="$DB/mysqld.log" --port="$DB_PORT" --bind-address=127.0.0.1 \
    --skip-name-resolve --innodb-buffer-pool-size=64M >/dev/null 2>&1 &
for _ in $(seq 60); do
    mariadb --no-defaults --socket="$DB/mysqld.sock" -uroot -e "SELECT 1" >/dev/null 2>&1 && break
    sleep 0.5
done
mariadb --no-defaults --socket="$DB/mysqld.sock" -uroot <<SQL
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
FLUSH PRIVILEGES;
SQL
ln -sf "$DB/mysqld.pid" "$STATE/run/mariadbd.pid"

# --- Slurm configs -----------------------------------------------------------------------------------------
cat >"$STATE/slurmdbd.conf" <<CONF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
LogFile=$STATE/log/slurmdbd.log
PidFile=$STATE/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
CONF
chmod 600 "$STATE/slurmdbd.conf"

cat >"$STATE/slurm.conf" <<CONF
ClusterName=klsweep
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=10
StateSaveLocation=$STATE/spool/ctld
SlurmdSpoolDir=$STATE/spool/d
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=5
MinJobAge=300
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF

cat >"$STATE/env.sh" <<CONF
export SLURM_CONF=$STATE/slurm.conf
CONF
export SLURM_CONF="$STATE/slurm.conf"

# --- daemons -----------------------------------------------------------------------------------------------
slurmdbd  # reads slurmdbd.conf next to $SLURM_CONF
for _ in $(seq 60); do
    (exec 3<>/dev/tcp/127.0.0.1/6819) 2>/dev/null && break
    sleep 0.5
done
slurmctld -f "$STATE/slurm.conf"
slurmd -f "$STATE/slurm.conf" -N localhost

ok=""
for _ in $(seq 120); do
    if sinfo -h -N -o "%t" 2>/dev/null | grep -qx "idle" && sacct -n -X -o JobID >/dev/null 2>&1; then
        ok=1
        break
    fi
    sleep 0.5
done
if [ -z "$ok" ]; then
    echo "slurm/start.sh: cluster did not come up; logs in $STATE/log and $DB/mysqld.log" >&2
    sinfo >&2 || true
    tail -n 20 "$STATE"/log/*.log >&2 || true
    exit 1
fi
echo "slurm/start.sh: cluster up ($CPUS CPUs, ${MEM_MB} MB); run: source $STATE/env.sh"
