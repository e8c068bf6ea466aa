#!/usr/bin/env bash
# slurm/devcluster.sh -- a real, multi-node Slurm 22.05 cluster on ONE machine, for rlkit development and tests.
#
#   slurm/devcluster.sh up       install slurm-wlm + munge if missing, start munged, write /etc/slurm/slurm.conf and
#                                /etc/slurm/gres.conf, start slurmctld and one slurmd per emulated node, wait until all
#                                nodes are usable. Idempotent: a second `up` on a running cluster is a fast no-op.
#   slurm/devcluster.sh down     stop the slurmd's and slurmctld this script started (by their pid files: TERM, wait,
#                                then KILL). munged is left running (it is a system service other tools may use).
#                                Jobs are not cancelled; their state stays in StateSaveLocation. Idempotent.
#   slurm/devcluster.sh status   print each daemon's state and `sinfo`; exit 0 if everything is up, 3 otherwise.
#
# Cluster "rlkitdev": nodes node[1-4], each a separate slurmd on this host (NodeAddr=127.0.0.1, ports 17001-17004)
# declaring CPUs=64 RealMemory=512000 Gres=gpu:8, the size of a real 8-GPU node so that GPU configs pass
# --test-only (SlurmdParameters=config_overrides lets a node claim more than the machine has). The 8 "GPUs" are character devices <state>/dev/fakegpu[0-7] (major 1 minor 3, i.e. /dev/null) shared
# by all nodes; Slurm hands them out and sets CUDA_VISIBLE_DEVICES exactly as on a real GPU site.
# One partition `debug` (default, no time limit). A requeued job runs again after ~31 s (AuthInfo=cred_expire=30;
# Slurm's default, and most sites', is 120 s). Backfill runs every second: heterogeneous jobs are only started by
# the backfill scheduler. There is no slurmdbd, hence no sacct; finished jobs stay visible in squeue/scontrol for
# MinJobAge=300 s.
#
# Nodes 1-3 see this machine's filesystem as it is; node4's slurmd runs in its own mount namespace where
# <state>/not-on-node4 is an empty tmpfs: the one place where the nodes' views differ, for the node check's test.
#
# The config files start with a marker line; a file without it is never overwritten (exit 2).
# State (spool dirs, StateSaveLocation, logs, pid files, fake devices): ${RLKIT_DEVCLUSTER_DIR:-/var/lib/rlkit-devcluster}
# Needs root (Debian 12). Exit codes: 0 ok, 1 error, 2 refused to overwrite a foreign config, 3 status: not all up.
set -euo pipefail

readonly MARKER="# managed by rlkit slurm/devcluster.sh"
readonly CLUSTER=rlkitdev
readonly NNODES=4
readonly NODES="node[1-${NNODES}]"
readonly PORT0=17001
readonly CTLD_PORT=6817
readonly CONF_DIR=/etc/slurm
readonly SLURM_CONF="$CONF_DIR/slurm.conf"
readonly GRES_CONF="$CONF_DIR/gres.conf"
STATE_DIR="$(realpath -m "${RLKIT_DEVCLUSTER_DIR:-/var/lib/rlkit-devcluster}")"
NOT_ON_LAST_NODE="$STATE_DIR/not-on-node${NNODES}"  # shared by every node but the last (see `up`)
readonly STATE_DIR
readonly TIMEOUT="${RLKIT_DEVCLUSTER_TIMEOUT:-90}"   # seconds to wait for the nodes to become usable
readonly CTLD_PIDFILE="$STATE_DIR/run/slurmctld.pid"

log() { printf 'devcluster: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

node_name() { printf 'node%d' "$1"; }
slurmd_pidfile() { printf '%s/run/slurmd-%s.pid' "$STATE_DIR" "$1"; }

# pid_alive PID: the process exists and is not a zombie (PID 1 of a container may reap late).
# Uses /proc instead of kill -0 so that `status` also works for non-root users.
pid_alive() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat:0:1} != [ZX] ]]
}

# pid_running PIDFILE COMM: succeeds (and prints the pid) if the pid in PIDFILE is alive and named COMM.
pid_running() {
  local pidfile=$1 comm=$2 pid
  [[ -r $pidfile ]] || return 1
  pid=$(tr -dc '0-9' <"$pidfile")
  [[ -n $pid ]] && pid_alive "$pid" || return 1
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$comm" ]] || return 1
  printf '%s' "$pid"
}

need_root() { [[ $EUID -eq 0 ]] || die "'$1' needs root"; }

# ---------------------------------------------------------------------------------------------------- install
ensure_installed() {
  local pkg missing=()
  for pkg in slurm-wlm munge; do
    if [[ $(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true) != "install ok installed" ]]; then
      missing+=("$pkg")
    fi
  done
  if ((${#missing[@]})); then
    log "installing ${missing[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q slurm-wlm munge
  fi
  local cmd
  for cmd in slurmctld slurmd munged sinfo; do
    command -v "$cmd" >/dev/null || die "$cmd not found after installing slurm-wlm and munge"
  done
}

# ---------------------------------------------------------------------------------------------------- munge
munge_works() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

ensure_munge() {
  local key=/etc/munge/munge.key i
  if [[ ! -s $key ]]; then
    log "creating munge key $key"
    install -d -o munge -g munge -m 0700 /etc/munge
    if command -v mungekey >/dev/null; then
      mungekey --create --keyfile="$key"
    else
      dd if=/dev/urandom of="$key" bs=1 count=1024 status=none
    fi
    chown munge:munge "$key"
    chmod 0400 "$key"
  fi
  munge_works && return 0
  log "starting munged"
  service munge start >/dev/null 2>&1 || runuser -u munge -- /usr/sbin/munged || true
  for ((i = 0; i < 50; i++)); do
    munge_works && return 0
    sleep 0.2
  done
  die "munged does not answer (munge -n | unmunge fails)"
}

# ---------------------------------------------------------------------------------------------------- config
render_slurm_conf() {
  local host=$1
  cat <<EOF
$MARKER
# Emulated multi-node dev cluster; regenerated by 'slurm/devcluster.sh up'. Edit the script, not this file.
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# Step credentials live 30 s (default 120): Slurm holds a requeued job that long (+1 s) before it runs again.
AuthInfo=cred_expire=30
CredType=cred/munge
StateSaveLocation=$STATE_DIR/ctld
SlurmctldPidFile=$CTLD_PIDFILE
SlurmctldLogFile=$STATE_DIR/log/slurmctld.log
SlurmctldDebug=info
SlurmdSpoolDir=$STATE_DIR/spool/%n
SlurmdPidFile=$STATE_DIR/run/slurmd-%n.pid
SlurmdLogFile=$STATE_DIR/log/slurmd-%n.log
SlurmdDebug=info
# Several slurmd on one host: no cgroups, process tracking by parent pid.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SlurmdParameters=config_overrides
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# A job without --mem gets 1000 MB per CPU (not a whole node's memory).
DefMemPerCPU=1000
GresTypes=gpu
# No slurmdbd: no accounting, no sacct. Do NOT add AccountingStorageTRES (slurmctld then requires slurmdbd).
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# Hetjobs are only started by the backfill scheduler: run it every second.
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
# Short timings for a dev box (the time slice only matters under gang scheduling).
SchedulerTimeSlice=5
MessageTimeout=10
# Bring nodes back after restarts; finished jobs stay in squeue -t all / scontrol show job for 5 min (no sacct).
ReturnToService=2
KillWait=5
MinJobAge=300
InactiveLimit=0
Waittime=0
MailProg=/bin/true
NodeName=$NODES NodeHostname=$host NodeAddr=127.0.0.1 Port=$PORT0-$((PORT0 + NNODES - 1)) CPUs=64 RealMemory=512000 Gres=gpu:8 State=UNKNOWN
PartitionName=debug Nodes=$NODES Default=YES MaxTime=INFINITE State=UP
EOF
}

render_gres_conf() {
  cat <<EOF
$MARKER
# Fake GPUs: character devices (major 1, minor 3 = /dev/null) shared by all emulated nodes.
AutoDetect=off
NodeName=$NODES Name=gpu File=$STATE_DIR/dev/fakegpu[0-7]
EOF
}

# check_writable FILE: exit 2 if FILE exists and is not ours.
check_writable() {
  local f=$1
  if [[ -e $f ]] && [[ $(head -n1 "$f" 2>/dev/null) != "$MARKER" ]]; then
    log "refusing to overwrite $f: it exists and its first line is not '$MARKER'."
    log "It belongs to another Slurm setup; move it away yourself if this machine should run the rlkit dev cluster."
    exit 2
  fi
}

# write_if_changed FILE CONTENT: (re)writes FILE atomically if its content differs; sets CONFIG_CHANGED=1 then.
CONFIG_CHANGED=0
write_if_changed() {
  local f=$1 content=$2
  if [[ -f $f ]] && [[ $(cat "$f") == "$content" ]]; then
    return 0
  fi
  printf '%s\n' "$content" >"$f.rlkit-tmp"
  chmod 0644 "$f.rlkit-tmp"
  mv -f "$f.rlkit-tmp" "$f"
  log "wrote $f"
  CONFIG_CHANGED=1
}

ensure_state_dirs() {
  local i
  mkdir -p "$STATE_DIR"/{ctld,log,run,dev}
  for ((i = 1; i <= NNODES; i++)); do mkdir -p "$STATE_DIR/spool/$(node_name "$i")"; done
  chmod 0755 "$STATE_DIR" "$STATE_DIR/dev"
  for ((i = 0; i < 8; i++)); do
    local d="$STATE_DIR/dev/fakegpu$i"
    if [[ ! -c $d ]]; then
      rm -f "$d"
      mknod -m 0666 "$d" c 1 3
    fi
  done
}

# ensure_config: writes both files (CONFIG_CHANGED=1 if either changed).
ensure_config() {
  local host
  host=$(hostname)
  check_writable "$SLURM_CONF"
  check_writable "$GRES_CONF"
  mkdir -p "$CONF_DIR"
  write_if_changed "$SLURM_CONF" "$(render_slurm_conf "$host")"
  write_if_changed "$GRES_CONF" "$(render_gres_conf)"
}

# ---------------------------------------------------------------------------------------------------- daemons
any_daemon_running() {
  local i
  pid_running "$CTLD_PIDFILE" slurmctld >/dev/null && return 0
  for ((i = 1; i <= NNODES; i++)); do
    pid_running "$(slurmd_pidfile "$(node_name "$i")")" slurmd >/dev/null && return 0
  done
  return 1
}

# wait_pidfile PIDFILE COMM LOGFILE WHAT
wait_pidfile() {
  local pidfile=$1 comm=$2 logfile=$3 what=$4 i
  for ((i = 0; i < 100; i++)); do
    pid_running "$pidfile" "$comm" >/dev/null && return 0
    sleep 0.1
  done
  log "$what did not start; last lines of $logfile:"
  tail -n 20 "$logfile" >&2 2>/dev/null || true
  exit 1
}

start_daemons() {
  local i n pf
  if ! pid_running "$CTLD_PIDFILE" slurmctld >/dev/null; then
    local other="" p
    for p in $(pgrep -x slurmctld || true); do pid_alive "$p" && other+="$p "; done
    [[ -z $other ]] || die "a slurmctld not started by this script is running (pid ${other% }); stop it first"
    rm -f "$CTLD_PIDFILE"
    log "starting slurmctld"
    slurmctld
    wait_pidfile "$CTLD_PIDFILE" slurmctld "$STATE_DIR/log/slurmctld.log" slurmctld
  fi
  for ((i = 1; i <= NNODES; i++)); do
    n=$(node_name "$i")
    pf=$(slurmd_pidfile "$n")
    if ! pid_running "$pf" slurmd >/dev/null; then
      rm -f "$pf"
      log "starting slurmd -N $n"
      if [ "$i" -eq "$NNODES" ]; then
        # The last node sees an empty tmpfs at $NOT_ON_LAST_NODE (its own mount namespace): a directory the other
        # nodes share and it does not, as a node-local fileroot would be (the node check's test uses it).
        mkdir -p "$NOT_ON_LAST_NODE"
        # shellcheck disable=SC2016  # $1 and $2 are the inner sh's arguments
        unshare --mount --propagation private sh -c 'mount -t tmpfs -o size=1m,mode=0755 rlkit-node-local "$1" &&
          exec slurmd -N "$2"' sh "$NOT_ON_LAST_NODE" "$n"
      else
        slurmd -N "$n"
      fi
      wait_pidfile "$pf" slurmd "$STATE_DIR/log/slurmd-$n.log" "slurmd -N $n"
    fi
  done
}

# stop_pids COMM PIDFILE...: TERM every live daemon named COMM in the pid files at once, wait up to 15 s, then KILL.
stop_pids() {
  local comm=$1 pf pid i pids=()
  shift
  for pf in "$@"; do
    if pid=$(pid_running "$pf" "$comm"); then
      log "stopping $comm (pid $pid, $(basename "$pf" .pid))"
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done
  alive() { local p; for p in "${pids[@]}"; do pid_alive "$p" && return 0; done; return 1; }
  for ((i = 0; i < 150; i++)); do
    alive || break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do
    if pid_alive "$pid"; then
      log "$comm (pid $pid) ignored TERM for 15 s: KILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  for ((i = 0; i < 50; i++)); do
    alive || break
    sleep 0.1
  done
  rm -f "$@"
}

stop_daemons() {
  local i pfs=()
  for ((i = 1; i <= NNODES; i++)); do pfs+=("$(slurmd_pidfile "$(node_name "$i")")"); done
  stop_pids slurmd "${pfs[@]}"
  stop_pids slurmctld "$CTLD_PIDFILE"
}

# ---------------------------------------------------------------------------------------------------- nodes
# Prints "<node> <state>" lines; fails if the controller does not answer.
node_states() { timeout 20 sinfo -h -N -p debug -o '%N %T' 2>/dev/null; }

# A node can run jobs if it responds (no '*') and its base state is one of these. sinfo %T may append flag
# characters (e.g. '~' powered off, '@' reboot pending, '$' maintenance); "planned" = idle but held by backfill.
usable_state() {
  [[ $1 != *'*'* ]] || return 1
  [[ ${1%%[~#%!@^\$+-]*} =~ ^(idle|mixed|allocated|completing|planned|reserved)$ ]]
}

count_usable() {
  local n=0 node state
  while read -r node state; do
    usable_state "$state" && n=$((n + 1))
  done <<<"$1"
  printf '%d' "$n"
}

wait_nodes_ready() {
  local deadline=$((SECONDS + TIMEOUT)) states node state last_resume=-100
  while :; do
    if states=$(node_states) && [[ $(count_usable "$states") -eq $NNODES ]]; then
      return 0
    fi
    if ! pid_running "$CTLD_PIDFILE" slurmctld >/dev/null; then
      log "slurmctld died; last lines of $STATE_DIR/log/slurmctld.log:"
      tail -n 20 "$STATE_DIR/log/slurmctld.log" >&2 || true
      exit 1
    fi
    if ((SECONDS >= deadline)); then
      log "nodes not usable after ${TIMEOUT}s:"
      printf '%s\n' "${states:-<sinfo does not answer>}" >&2
      log "logs: $STATE_DIR/log/"
      exit 1
    fi
    # Resume nodes that are down or drained (e.g. after an unclean stop); at most every 3 s.
    if [[ -n ${states:-} ]] && ((SECONDS - last_resume >= 3)); then
      while read -r node state; do
        if [[ $state =~ ^(down|drained|draining|drain|fail|failing) && $state != *'*' ]]; then
          log "resuming $node (was $state)"
          scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
          last_resume=$SECONDS
        fi
      done <<<"$states"
    fi
    sleep 0.3
  done
}

# ---------------------------------------------------------------------------------------------------- commands
cmd_up() {
  need_root up
  check_writable "$SLURM_CONF"
  check_writable "$GRES_CONF"
  ensure_installed
  ensure_munge
  mkdir -p "$STATE_DIR"
  exec 9>"$STATE_DIR/.lock"
  flock -w 120 9 || die "another devcluster.sh holds $STATE_DIR/.lock"
  ensure_state_dirs
  ensure_config
  if ((CONFIG_CHANGED)) && any_daemon_running; then
    log "configuration changed: restarting the daemons"
    stop_daemons
  fi
  start_daemons
  wait_nodes_ready
  local states
  states=$(node_states || true)
  printf 'rlkitdev up: %d/%d nodes usable (%s), partition debug, %s, state %s\n' \
    "$(count_usable "$states")" "$NNODES" "$(awk '{print $2}' <<<"$states" | sort | uniq -c | awk '{printf "%s%s %s", s, $1, $2; s=", "}')" \
    "$(sinfo -h -N -o '%G' 2>/dev/null | sort -u | paste -sd, -)" "$STATE_DIR"
}

cmd_down() {
  need_root down
  if [[ -d $STATE_DIR ]]; then
    exec 9>"$STATE_DIR/.lock"
    flock -w 120 9 || die "another devcluster.sh holds $STATE_DIR/.lock"
  fi
  stop_daemons
  echo "rlkitdev down: slurmctld and slurmd stopped (munged left running)"
}

cmd_status() {
  local ok=0 pid i n states
  if munge_works; then echo "munged:      running"; else echo "munged:      NOT running"; ok=1; fi
  if pid=$(pid_running "$CTLD_PIDFILE" slurmctld); then
    echo "slurmctld:   running (pid $pid)"
  else
    echo "slurmctld:   NOT running"
    ok=1
  fi
  for ((i = 1; i <= NNODES; i++)); do
    n=$(node_name "$i")
    if pid=$(pid_running "$(slurmd_pidfile "$n")" slurmd); then
      printf 'slurmd %-5s running (pid %s)\n' "$n:" "$pid"
    else
      printf 'slurmd %-5s NOT running\n' "$n:"
      ok=1
    fi
  done
  if pid_running "$CTLD_PIDFILE" slurmctld >/dev/null; then
    if states=$(node_states); then
      timeout 20 sinfo -N -o '%N %P %T %c %m %G' || true
      if [[ $(count_usable "$states") -ne $NNODES ]]; then
        echo "not all $NNODES nodes are usable"
        ok=1
      fi
    else
      echo "sinfo: controller does not answer"
      ok=1
    fi
  fi
  if ((ok == 0)); then echo "rlkitdev: up"; else echo "rlkitdev: DOWN (run: sudo slurm/devcluster.sh up)"; fi
  return $((ok == 0 ? 0 : 3))
}

main() {
  case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status || exit $? ;;
    *)
      echo "usage: $0 up|down|status" >&2
      exit 1
      ;;
  esac
}

main "$@"
