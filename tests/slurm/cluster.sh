#!/bin/bash
# A one-node Slurm cluster on loopback for spcli's Slurm tests: munge, mariadb + slurmdbd (so
# sacct works), slurmctld and slurmd, run as root without systemd.
#
#   tests/slurm/cluster.sh up       install missing Debian packages, start what is not running
#   tests/slurm/cluster.sh down     cancel jobs, stop the daemons, delete the state directory
#   tests/slurm/cluster.sh status   exit 0 when every daemon runs and the node is usable, else 3
#   tests/slurm/cluster.sh env      print the `export SLURM_CONF=...` clients need
#   tests/slurm/cluster.sh install  install the missing Debian packages only (tests/system_packages.sh)
#   tests/slurm/cluster.sh packages print their names
#
# Both `up` and `down` are idempotent. Everything (config, state, logs, sockets, the munge key,
# the database) lives under $SLURM_CI_DIR; clients find the config through $SLURM_CONF.
#
#   SLURM_CI_DIR         state directory (default /tmp/spcli-slurm)
#   SLURM_CI_ACCOUNTING  1 = mariadb + slurmdbd, sacct works (default); 0 = no accounting
#   SLURM_CI_CPUS        CPUs the node advertises (default: max(nproc, 4)); more than the
#                        machine has is fine (config_overrides), so small CI runners still run
#                        a few array tasks at once
#   SLURM_CI_WIPE        0 = `down` keeps the state directory (logs) (default 1)
#
# Exit codes: 0 ok; 2 usage; 3 `status`: not (fully) up; 100 the packages are missing and cannot
# be installed (not root, no apt-get): the tests skip on 100 and fail on anything else (apt-get failing
# where it could install is 1: a failure, not a skip).
set -euo pipefail
EXIT_NO_PACKAGES=100

DIR=${SLURM_CI_DIR:-/tmp/spcli-slurm}
ACCOUNTING=${SLURM_CI_ACCOUNTING:-1}
NODE=localhost
export SLURM_CONF=$DIR/etc/slurm.conf
# slurmdbd's client library takes its socket from here; the `mariadb` tool does not (Debian's
# my.cnf names /run/mysqld/mysqld.sock, which beats the variable), so it gets --socket.
export MYSQL_UNIX_PORT=$DIR/mysql/mysqld.sock
MUNGE_SOCKET=$DIR/munge/munge.socket

case $DIR in /*) ;; *) echo "SLURM_CI_DIR must be an absolute path, got '$DIR'" >&2; exit 2 ;; esac
[ "$DIR" != / ] || { echo "SLURM_CI_DIR must not be /" >&2; exit 2; }

log() { echo "cluster.sh: $*" >&2; }

# is_running PIDFILE COMM: the pid in PIDFILE is alive and is that program (not a reused pid).
is_running() {
  local pid
  [ -s "$1" ] || return 1
  pid=$(<"$1")
  [ -r "/proc/$pid/comm" ] && [ "$(<"/proc/$pid/comm")" = "$2" ]
}

# wait_until SECONDS LOGFILE COMMAND...: poll COMMAND (a client may hang while a daemon starts,
# hence its own 5 s limit) until it succeeds; on timeout show the daemon's log.
wait_until() {
  local seconds=$1 logfile=$2 deadline
  shift 2
  deadline=$((SECONDS + seconds))
  while ((SECONDS < deadline)); do
    timeout 5 "$@" >/dev/null 2>&1 && return 0
    sleep 0.25
  done
  log "timed out after ${seconds}s waiting for: $*"
  [ -f "$logfile" ] && tail -n 20 "$logfile" >&2
  return 1
}

# stop PIDFILE:COMM...: TERM them all, wait up to 10 s, then KILL what is left. A stale pid
# (or one now used by another program) is left alone.
stop() {
  local entry pids=() pid i alive
  for entry in "$@"; do
    if is_running "${entry%%:*}" "${entry##*:}"; then
      pid=$(<"${entry%%:*}")
      kill "$pid" 2>/dev/null && pids+=("$pid")
    fi
    rm -f "${entry%%:*}"
  done
  for ((i = 0; i < 40; i++)); do
    alive=0
    for pid in "${pids[@]}"; do [ -d "/proc/$pid" ] && alive=1; done
    [ "$alive" = 0 ] && return 0
    sleep 0.25
  done
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
}

packages() {
  local packages="munge slurmctld slurmd slurm-client"
  [ "$ACCOUNTING" = 1 ] && packages="$packages slurmdbd mariadb-server"
  echo "$packages"
}

# Exit 100 where they cannot be installed (not root, no apt-get); 1 where apt-get failed on a machine that could
# install them (the tests fail then: inside tests/loopback.sh's namespace apt cannot reach the archive, so
# `make test` installs them before, through tests/system_packages.sh).
ensure_packages() {
  local packages
  packages=$(packages)
  # shellcheck disable=SC2086
  dpkg -s $packages >/dev/null 2>&1 && return 0
  [ "$(id -u)" = 0 ] || { log "need root to install: $packages"; exit "$EXIT_NO_PACKAGES"; }
  command -v apt-get >/dev/null || { log "no apt-get to install: $packages"; exit "$EXIT_NO_PACKAGES"; }
  log "installing $packages"
  # shellcheck disable=SC2086
  sh "$(dirname "$0")/../apt_install.sh" --no-install-recommends $packages ||
    { log "apt-get could not install: $packages (in tests/loopback.sh's network namespace it cannot: run \`bash tests/slurm/cluster.sh install\` first)"; exit 1; }
}

start_munge() {
  is_running "$DIR/munge/munged.pid" munged && return 0
  # The socket directory is world-readable so non-root job users could authenticate too;
  # the key, seed and log sit in a private directory, as munged insists.
  install -d -o munge -g munge -m 0755 "$DIR/munge"
  install -d -o munge -g munge -m 0700 "$DIR/munge/private"
  if [ ! -s "$DIR/munge/private/munge.key" ]; then
    mungekey --create --keyfile="$DIR/munge/private/munge.key"
    chown munge:munge "$DIR/munge/private/munge.key"
    chmod 0400 "$DIR/munge/private/munge.key"
  fi
  su -s /bin/sh munge -c "/usr/sbin/munged --socket='$MUNGE_SOCKET' \
    --key-file='$DIR/munge/private/munge.key' --pid-file='$DIR/munge/munged.pid' \
    --log-file='$DIR/munge/private/munged.log' --seed-file='$DIR/munge/private/munged.seed'"
  wait_until 15 "$DIR/munge/private/munged.log" \
    sh -c "munge -n --socket='$MUNGE_SOCKET' | unmunge --socket='$MUNGE_SOCKET'"
}

start_mariadb() {
  install -d -o mysql -g mysql "$DIR/mysql"
  if ! is_running "$DIR/mysql/mariadb.pid" mariadbd; then
    if [ ! -d "$DIR/mysql/data/mysql" ]; then
      mariadb-install-db --user=mysql --datadir="$DIR/mysql/data" --skip-test-db \
        --auth-root-authentication-method=socket >"$DIR/log/mariadb-install.log" 2>&1
    fi
    setsid /usr/sbin/mariadbd --user=mysql --datadir="$DIR/mysql/data" --skip-networking \
      --socket="$MYSQL_UNIX_PORT" --pid-file="$DIR/mysql/mariadb.pid" \
      --log-error="$DIR/mysql/mariadb.log" </dev/null >/dev/null 2>&1 &
    wait_until 30 "$DIR/mysql/mariadb.log" mariadb --socket="$MYSQL_UNIX_PORT" -e 'select 1'
  fi
  mariadb --socket="$MYSQL_UNIX_PORT" -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
}

# write_if_changed FILE MODE: replace FILE with stdin when the content differs; 0 = changed.
write_if_changed() {
  local tmp
  tmp=$(mktemp "$1.XXXXXX")
  cat >"$tmp"
  chmod "$2" "$tmp"
  if cmp -s "$tmp" "$1"; then
    rm -f "$tmp"
    return 1
  fi
  mv -f "$tmp" "$1"
}

start_slurmdbd() {
  write_if_changed "$DIR/etc/slurmdbd.conf" 0600 <<EOF || true
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
LogFile=$DIR/log/slurmdbd.log
PidFile=$DIR/run/slurmdbd.pid
EOF
  is_running "$DIR/run/slurmdbd.pid" slurmdbd || slurmdbd
  wait_until 30 "$DIR/log/slurmdbd.log" sacctmgr --noheader list cluster
}

slurm_conf() {
  local cpus memory_mb accounting
  cpus=${SLURM_CI_CPUS:-$(($(nproc) > 4 ? $(nproc) : 4))}
  memory_mb=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) * 9 / 10 / 1024))  # 90% of RAM
  if [ "$ACCOUNTING" = 1 ]; then
    accounting="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePass=$MUNGE_SOCKET
JobAcctGatherType=jobacct_gather/linux"
  else
    accounting="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
  fi
  # AuthInfo (slurmctld, slurmd, job commands) and AccountingStoragePass (whatever talks to
  # slurmdbd: sacct, sacctmgr, slurmctld) point at our munged, not /run/munge's.
  # cred_expire also delays a requeued job: it may start again cred_expire + 1 s after the
  # requeue (BeginTime), so 5 instead of the default 120 keeps the requeue tests short.
  cat <<EOF
# Written by tests/slurm/cluster.sh; edits are overwritten by the next \`up\`.
ClusterName=spcli-ci
SlurmctldHost=localhost
SlurmUser=root
AuthType=auth/munge
AuthInfo=cred_expire=5,socket=$MUNGE_SOCKET
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
MpiDefault=none
# No cgroups in containers: track processes by parent pid, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmdParameters=config_overrides
SelectType=select/cons_tres
SelectTypeParameters=CR_Core

# Fast scheduling so tests do not wait: main loop every 2 s, backfill every 1 s.
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=1
$accounting
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.txt

# Batch jobs may be requeued (scontrol requeue, preemption); finished jobs stay visible to
# squeue/scontrol for 5 minutes; KILL follows TERM after 5 s.
JobRequeue=1
ReturnToService=2
MinJobAge=300
KillWait=5
MailProg=/bin/true

# A job in partition \`high\` preempts jobs in \`debug\`, which are requeued. With
# preempt_send_user_signal the job's --signal (spcli: B:USR1) is sent when preemption starts;
# TERM follows GraceTime seconds later (10, short for tests), then KILL after KillWait.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal

StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log

NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus Sockets=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$memory_mb State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=10
PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
EOF
}

# An external command, so that wait_until can put a time limit on it.
NODE_USABLE="sinfo --noheader --nodes=$NODE --format=%t | grep -qxE 'idle|mix|alloc|comp'"

up() {
  ensure_packages
  mkdir -p "$DIR"/{etc,state,spool,log,run}
  # First, as every client (sacctmgr included) reads it.
  if slurm_conf | write_if_changed "$SLURM_CONF" 0644 && is_running "$DIR/run/slurmctld.pid" slurmctld; then
    log "slurm.conf changed: reconfiguring the running daemons"
    scontrol reconfigure
  fi
  start_munge
  if [ "$ACCOUNTING" = 1 ]; then
    start_mariadb
    start_slurmdbd
  fi
  is_running "$DIR/run/slurmctld.pid" slurmctld || slurmctld
  wait_until 30 "$DIR/log/slurmctld.log" sh -c 'scontrol ping | grep -q UP'
  is_running "$DIR/run/slurmd.pid" slurmd || slurmd -N "$NODE"
  wait_until 30 "$DIR/log/slurmd.log" sh -c "$NODE_USABLE"
  sinfo
}

down() {
  local i
  if is_running "$DIR/run/slurmctld.pid" slurmctld; then
    # slurmstepd outlives slurmd: cancel the jobs first so no job process is left behind.
    squeue --noheader --format=%A | xargs --no-run-if-empty scancel --quiet 2>/dev/null || true
    for ((i = 0; i < 60; i++)); do
      [ -z "$(squeue --noheader --format=%A 2>/dev/null)" ] && break
      sleep 0.25
    done
  fi
  # Slurm first (slurmctld still reports to slurmdbd as it stops), then what it depends on.
  stop "$DIR/run/slurmd.pid:slurmd" "$DIR/run/slurmctld.pid:slurmctld"
  stop "$DIR/run/slurmdbd.pid:slurmdbd" "$DIR/mysql/mariadb.pid:mariadbd" "$DIR/munge/munged.pid:munged"
  if [ "${SLURM_CI_WIPE:-1}" = 1 ]; then rm -rf "$DIR"; fi
}

status() {
  local ok=0 entry pidfile comm
  for entry in munge/munged.pid:munged mysql/mariadb.pid:mariadbd run/slurmdbd.pid:slurmdbd \
    run/slurmctld.pid:slurmctld run/slurmd.pid:slurmd; do
    pidfile=$DIR/${entry%%:*} comm=${entry##*:}
    if [ "$ACCOUNTING" != 1 ] && [[ $comm == mariadbd || $comm == slurmdbd ]]; then continue; fi
    if is_running "$pidfile" "$comm"; then
      echo "$comm: running (pid $(<"$pidfile"))"
    else
      echo "$comm: stopped"
      ok=3
    fi
  done
  if is_running "$DIR/run/slurmctld.pid" slurmctld; then
    sinfo
    squeue
    sh -c "$NODE_USABLE" || ok=3
  fi
  return $ok
}

case ${1:-} in
  up | down | status) "$1" ;;
  install) ensure_packages ;;  # the Debian packages only (make test, outside the tests' network namespace)
  packages) packages ;;  # their names (tests/system_packages.sh)
  env) echo "export SLURM_CONF=$SLURM_CONF" ;;
  *) echo "usage: $0 up|down|status|env|install|packages" >&2; exit 2 ;;
esac
