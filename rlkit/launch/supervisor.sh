# shellcheck shell=bash
# shellcheck disable=SC2317  # functions run indirectly: the traps, and start_step's "$fn"
# The body of every rlkit job script: rlkit.launch.render puts the #SBATCH lines above it and fills in the fields
# between @ signs. It starts every step in the background and supervises them: it exits non-zero as soon as any step
# fails (after stopping the others), stops the servers once the work steps (trainer/client) succeed, restarts failed
# steps, requeues the job when the trainer checkpointed before the time limit, and forwards a TERM from Slurm to
# every step, so no step is ever left running. What it does with each step is its component's entry in the policy
# table (rlkit.launch.plan.ComponentPolicy, one component_policy line each), never a role's name. What the trainer
# tells it (its step_state file, its exit codes) is rlkit.step_contract's.
set -u
cd @TRIAL_DIR@ || exit 1
echo "rlkit: job $SLURM_JOB_ID on $(hostname)"
export RLKIT_ATTEMPT=@ATTEMPT@  # 1 for rlkit submit, one more per rlkit resume
RETRIES=@RETRIES@  # restarts of a failed trainer or server step, and self-requeues
NO_RETRY_EXIT=@NO_RETRY_EXIT@  # a step's exit code for a failure a restart cannot fix
NO_RETRY_MARK=@NO_RETRY_MARK@  # the line a step's process prints in its log as it exits with NO_RETRY_EXIT
EXIT_REQUEUE=@EXIT_REQUEUE@  # the trainer checkpointed for a requeue; also this script's exit when out of requeues
STATUS_REQUEUE=@STATUS_REQUEUE@  # the trainer's status after it checkpointed on the time-limit warning
STATUS_STOPPED=@STATUS_STOPPED@  # the trainer's status after it checkpointed on `rlkit stop`
STEP_STATE=@STEP_STATE@  # the trainer's last finished step and its status, one per line
JOB_END=@JOB_END@  # how the job ended, written as this script exits (for rlkit status once Slurm forgets the job)
END_STATE=""  # set by the path that ends the job; REQUEUED: no end (the job runs again)
TRAINER_GROUP=@TRAINER_GROUP@  # the component Slurm's time-limit warning goes to
PACKED=@PACKED@  # 1: one allocation whose steps share nodes (signals go to the trainer's steps by step id)
NODE_CHECK_LOG=@NODE_CHECK_LOG@  # each node's answer to the node check
NODE_CHECK_ADDRESS_MARK=@NODE_CHECK_ADDRESS_MARK@  # starts the line where the node check's listener gives its address
STOP_GRACE=30  # seconds steps get to stop cleanly (servers deregister) before srun is made to kill them
# Seconds one Slurm client call (squeue, scancel, scontrol) may take: a controller that hangs must not hold the
# time-limit warning (recover.time_limit_warning, 300 s by default; the step lookup, asked twice, and its signal take
# 45 s at most) past the limit, nor a stop past STOP_GRACE (one scancel before it); a healthy controller answers in
# well under a second.
SLURM_CALL_S=${RLKIT_SLURM_CALL_TIMEOUT:-15}
exec 8>&1  # the job log, for slurm_call's word from inside a command substitution

slurm_call() {  # slurm_call COMMAND ARG...: the Slurm client call, ended after SLURM_CALL_S (exit code 124) with a
  # line in the job log; otherwise its own exit code and output, so each caller keeps its own fallback
  local rc
  timeout --kill-after=5 "$SLURM_CALL_S" "$@"
  rc=$?
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "rlkit: $* did not answer within $SLURM_CALL_S s (the Slurm controller is busy or unreachable);" \
      "going on without it" >&8
    return 124
  fi
  return "$rc"
}

# One job at a time on a trial: this script holds the trial's job lock (flock, kept by NFS across nodes) until it
# exits, and a second job of the trial (a resume racing a requeue, a submit from a login node whose lock is not
# shared) waits for it a while, then exits before touching anything (no job_end, no step, no record).
TRIAL_LOCK_WAIT=${RLKIT_TRIAL_LOCK_WAIT:-120}  # seconds: a stopped job's steps may take STOP_GRACE and more to end
exec 9>>@JOB_LOCK@
flock -w "$TRIAL_LOCK_WAIT" 9
LOCK_RC=$?
if [ "$LOCK_RC" -eq 1 ]; then  # still held after the wait
  HOLDER=""
  read -r _ HOLDER _ <@JOB_LOCK@ 2>/dev/null
  HOLDER_STATE=$(slurm_call squeue --noheader --jobs="${HOLDER:-0}" --format=%T 2>&1)
  if [ "${HOLDER:-}" = "$SLURM_JOB_ID" ] || [[ $HOLDER_STATE == *"Invalid job id"* ]]; then
    # this job's own earlier run, or a job Slurm no longer knows: a lock a failed node's NFS client left behind
    echo "rlkit: the trial's job lock is still held for job ${HOLDER:-?}, which is this job's earlier run or gone" \
      "from Slurm; going on"
  else
    echo "rlkit: another job of this trial holds it ($(cat @JOB_LOCK@ 2>/dev/null || echo unknown)) after" \
      "$TRIAL_LOCK_WAIT s; this job exits without touching the trial"
    exit "$NO_RETRY_EXIT"
  fi
elif [ "$LOCK_RC" -ne 0 ]; then
  echo "rlkit: the trial's job lock cannot be taken on this filesystem (flock exit $LOCK_RC); going on without it"
fi
echo "job $SLURM_JOB_ID on $(hostname) since $(date -u +%FT%TZ)" >@JOB_LOCK@

PIDS=()
NAMES=()
GROUPS_OF=()  # each step's component (het group): its row of the policy table

FNS=()
RESTARTS=()
LAST_STEP=()

# The policy table, one row per component (het group), filled by component_policy lines before the steps start:
POLICY_ROLE=()     # its role, for messages
POLICY_WORK=()     # 1: the job is done once every work step finished; 0: its steps are stopped then (servers)
POLICY_RESTART=()  # on-exit: restarted whenever it exits while the job runs; on-failure: after a failure, unless no
                   # training step finished since its last restart; never
POLICY_STATE=()    # 1: its steps write the step_state the requeue and stop decisions read (the trainer)

component_policy() {  # component_policy GROUP ROLE WORK RESTART REPORTS_STATE: one row of the policy table
  POLICY_ROLE[$1]=$2
  POLICY_WORK[$1]=$3
  POLICY_RESTART[$1]=$4
  POLICY_STATE[$1]=$5
}

start_step() {  # start_step NAME GROUP FUNCTION: run one srun step (a function holding its command) in the background
  local name=$1 group=$2 fn=$3
  "$fn" &
  PIDS+=("$!")
  NAMES+=("$name")
  GROUPS_OF+=("$group")
  FNS+=("$fn")
  RESTARTS+=(0)
  LAST_STEP+=("$(trained_step)")
  echo "rlkit: started step $name (pid $!)"
}

restart_step() {  # restart_step INDEX: the same step again, in this allocation
  local i=$1
  RESTARTS[i]=$((RESTARTS[i] + 1))
  LAST_STEP[i]=$(trained_step)
  export RLKIT_STEP_RETRY=${RESTARTS[$i]}
  "${FNS[$i]}" &
  PIDS[i]=$!
  echo "rlkit: restarted step ${NAMES[$i]} (retry ${RESTARTS[$i]} of $RETRIES, pid $!)"
}

no_retry_reason() {  # no_retry_reason INDEX: the `failed:` line its process printed before this run's no-retry mark
  # (rlkit's own words: the disk is full, a server that cannot start, a trainer out of memory), else the log's last
  # such line; cut to 400 characters
  awk -v mark="$NO_RETRY_MARK $SLURM_JOB_ID.${SLURM_RESTART_COUNT:-0}.${RESTARTS[$1]}" '
    (i = index($0, "failed: ")) { last = substr($0, i + 8, 400) }
    length($0) >= length(mark) && substr($0, length($0) - length(mark) + 1) == mark { print last; done = 1; exit }
    END { if (!done && last != "") print last }
  ' "logs/${NAMES[$1]}.log" 2>/dev/null
}

no_retry_logged() {  # no_retry_logged INDEX: a process of this run of the step exited with NO_RETRY_EXIT, whatever
  # code srun reports (srun gives the highest of its tasks': a rank it killed after another's 78 reports 143)
  # (the mark ends its line; what comes before it on the line may be another process's unfinished output)
  grep -a -q -- "$NO_RETRY_MARK $SLURM_JOB_ID\.${SLURM_RESTART_COUNT:-0}\.${RESTARTS[$1]}\$" \
    "logs/${NAMES[$1]}.log" 2>/dev/null
}

trainer_status() {  # the trainer's status (running, finished, requeue, stopped, failed: ...), from its step_state
  local step status
  { read -r step && read -r status; } 2>/dev/null <"$STEP_STATE" && echo "$status"  # none yet: silent
}

trained_step() {  # the trainer's last finished step, from its step_state (-1 when there is none yet)
  local step=""
  read -r step 2>/dev/null <"$STEP_STATE"
  case $step in
    '' | *[!0-9-]*) echo -1 ;;
    *) echo "$step" ;;
  esac
}

component_ids() {  # "GROUP JOB_ID" per component: a heterogeneous job's components, else the job itself
  local name found=0
  for name in $(compgen -A variable SLURM_JOB_ID_HET_GROUP_); do
    echo "${name##*_} ${!name}"
    found=1
  done
  if [ "$found" -eq 0 ]; then
    echo "0 $SLURM_JOB_ID"
  fi
}

stop_steps() {  # TERM every step (gracefully, through slurmctld), give them time, then force the rest
  local pid group id running waited=0
  while read -r group id; do
    slurm_call scancel --ctld --signal=TERM "$id" 2>/dev/null
  done < <(component_ids)
  while [ "$waited" -lt "$STOP_GRACE" ]; do
    running=0
    for pid in "${PIDS[@]}"; do
      [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && running=1
    done
    [ "$running" -eq 0 ] && break
    sleep 1
    waited=$((waited + 1))
  done
  for pid in "${PIDS[@]}"; do
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null
  done
  wait
}

write_job_end() {  # write_job_end EXIT_CODE: the job's end as Slurm will report it, replaced atomically
  local state=$END_STATE
  [ "$state" = REQUEUED ] && return 0
  if [ -z "$state" ]; then
    if [ "$1" -eq 0 ]; then state=COMPLETED; else state=FAILED; fi
  fi
  printf '%s\n%s\n%s\n%s\n' "$SLURM_JOB_ID" "$state" "$1" "$(date +%s)" >"$JOB_END.tmp" 2>/dev/null &&
    mv -f "$JOB_END.tmp" "$JOB_END"
}
trap 'write_job_end $?' EXIT

on_signal() {
  echo "rlkit: batch script received $1; stopping all steps"
  END_STATE=CANCELLED
  if [ -n "${SLURM_JOB_END_TIME:-}" ] && [ "$(date +%s)" -ge $((SLURM_JOB_END_TIME - 5)) ]; then
    END_STATE=TIMEOUT  # Slurm's TERM at the time limit, not a scancel
  fi
  stop_steps
  exit 143
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT

state_step_ids() {  # the Slurm step ids (JOB.STEP) of the running steps whose component reports state (the trainer)
  local i id name listing
  # one listing, asked twice when the controller did not answer in time (one slow answer must not cost the checkpoint)
  listing=$(slurm_call squeue --noheader --steps --jobs="$SLURM_JOB_ID" --format='%i %j' 2>/dev/null)
  [ $? -eq 124 ] && listing=$(slurm_call squeue --noheader --steps --jobs="$SLURM_JOB_ID" --format='%i %j' 2>/dev/null)
  for i in "${!NAMES[@]}"; do
    [ "${POLICY_STATE[${GROUPS_OF[$i]}]}" = 1 ] || continue
    while read -r id name; do
      [ "$name" = "${NAMES[$i]}" ] && echo "$id"
    done <<<"$listing"
  done
}

on_time_limit() {  # Slurm's warning before the time limit (--signal=B:USR1@...): the trainer checkpoints and stops
  echo "rlkit: time limit near (USR1); asking the trainer to checkpoint and stop"
  local group id
  if [ "$PACKED" = 1 ]; then  # one job: a signal to it would reach the servers' steps too
    local sent=0
    for id in $(state_step_ids); do
      slurm_call scancel --ctld --signal=USR1 "$id" 2>/dev/null && sent=1
    done
    if [ "$sent" -eq 0 ]; then
      echo "rlkit: no running trainer step to warn (squeue listed none); the job ends at its time limit without" \
        "a new checkpoint (rlkit resume continues from the last one)"
    fi
    return
  fi
  while read -r group id; do
    if [ "$group" -eq "$TRAINER_GROUP" ]; then
      slurm_call scancel --ctld --signal=USR1 "$id" 2>/dev/null
    fi
  done < <(component_ids)
}
trap on_time_limit USR1

supervise() {  # wait until the job is done: returns 0 when the last work step succeeded
  local i pid rc name role group work restart state busy why
  while true; do
    busy=0
    for i in "${!PIDS[@]}"; do
      pid=${PIDS[$i]}
      [ -z "$pid" ] && continue
      group=${GROUPS_OF[$i]}
      if kill -0 "$pid" 2>/dev/null; then
        [ "${POLICY_WORK[$group]}" = 1 ] && busy=1
        continue
      fi
      wait "$pid"
      rc=$?
      name=${NAMES[$i]}
      role=${POLICY_ROLE[$group]}
      work=${POLICY_WORK[$group]}
      restart=${POLICY_RESTART[$group]}
      state=${POLICY_STATE[$group]}
      PIDS[i]=""
      if [ "$state" = 1 ] && [ "$rc" -eq 0 ] && [ "$(trainer_status)" = "$STATUS_REQUEUE" ]; then
        if [ "${SLURM_RESTART_COUNT:-0}" -lt "$RETRIES" ]; then
          echo "rlkit: the trainer checkpointed before the time limit; requeueing the job" \
            "(requeue $((${SLURM_RESTART_COUNT:-0} + 1)) of $RETRIES)"
          stop_steps
          END_STATE=REQUEUED
          slurm_call scontrol requeue "$SLURM_JOB_ID" && return 0
          # not requeued (or not known to be): exit 0 would end the job COMPLETED and start an afterok dependent
          END_STATE=""
          echo "rlkit: the job could not be requeued (scontrol requeue failed or did not answer); the trainer" \
            "checkpointed, so rlkit resume continues it"
          return "$EXIT_REQUEUE"
        fi
        echo "rlkit: the trainer checkpointed before the time limit, but the job was requeued $RETRIES times" \
          "already; not requeueing (rlkit resume continues it)"
        stop_steps
        return "$EXIT_REQUEUE"
      fi
      if [ "$state" = 1 ] && [ "$rc" -eq 0 ] && [ "$(trainer_status)" = "$STATUS_STOPPED" ]; then
        echo "rlkit: the trainer checkpointed and stopped on request; stopping the servers"
        stop_steps
        # A stopped job ends CANCELLED, never COMPLETED: status must not call it finished and an afterok
        # dependent (the next stage) must not start, whichever of this line and `rlkit stop`'s scancel comes first.
        END_STATE=CANCELLED
        slurm_call scancel "$SLURM_JOB_ID" && return 0
        echo "rlkit: could not cancel job $SLURM_JOB_ID (scancel failed or did not answer); exiting 143 so that" \
          "Slurm does not record the stopped job as completed"
        return 143
      fi
      if [ "$rc" -ne 0 ] && [ "$rc" -ne "$NO_RETRY_EXIT" ] && no_retry_logged "$i"; then
        echo "rlkit: step $name: srun reports exit code $rc, but one of its processes exited with $NO_RETRY_EXIT"
        rc=$NO_RETRY_EXIT
      fi
      if [ "$rc" -eq "$NO_RETRY_EXIT" ]; then
        why=$(no_retry_reason "$i")
        [ -n "$why" ] && echo "rlkit: step $name: $why"
        echo "rlkit: step $name failed with exit code $rc, which a restart cannot fix (see its log); not retrying"
        echo "rlkit: step $name failed with exit code $rc; stopping the other steps"
        stop_steps
        return "$rc"
      fi
      if [ "$rc" -ne 0 ] && [ "$restart" = on-failure ] && [ "${RESTARTS[$i]}" -lt "$RETRIES" ]; then
        if [ "${RESTARTS[$i]}" -gt 0 ] && [ "$(trained_step)" = "${LAST_STEP[$i]}" ]; then
          echo "rlkit: step $name failed with exit code $rc again without finishing a step since its last" \
            "restart (crash loop); not retrying"
          echo "rlkit: step $name failed with exit code $rc; stopping the other steps"
          stop_steps
          return "$rc"
        fi
        echo "rlkit: step $name failed with exit code $rc at trained step $(trained_step); restarting it"
        restart_step "$i"
        busy=1
        continue
      fi
      if [ "$restart" = on-exit ] && [ "${RESTARTS[$i]}" -lt "$RETRIES" ]; then
        echo "rlkit: $role step $name exited (code $rc) while the job was running; restarting it"
        restart_step "$i"
        continue
      fi
      if [ "$rc" -ne 0 ]; then
        echo "rlkit: step $name failed with exit code $rc; stopping the other steps"
        stop_steps
        return "$rc"
      fi
      if [ "$work" != 1 ]; then
        echo "rlkit: $role step $name exited while the job was running; stopping the other steps"
        stop_steps
        return 1
      fi
      echo "rlkit: step $name finished"
    done
    if [ "$busy" -eq 0 ]; then
      echo "rlkit: all work steps finished; stopping the servers"
      stop_steps
      return 0
    fi
    sleep 1 &
    wait $!
  done
}

check_nodes() {  # step 0, seconds before any work: rlkit.steps.node_check on every node of every component (one
  # srun per component, all at once, each with its component's GPUs, image and python). Each node reads a token this
  # script has just written in the trial directory (a fileroot some node does not share fails here with that reason,
  # not as servers and a trainer that never find each other's records), counts the GPUs it sees, and connects to the
  # work component's first node, which listens and prints its address for this script to put beside the token.
  local canary token here rc
  here=${SLURMD_NODENAME:-$(hostname)}
  canary=$PWD/.node-check.$SLURM_JOB_ID.${SLURM_RESTART_COUNT:-0}
  token=$SLURM_JOB_ID.$RANDOM.$RANDOM
  if ! { echo "$token" >"$canary" && : >"$canary.address"; }; then
    echo "rlkit: cannot write in the trial directory $PWD on $here"
    echo "rlkit: step node-check failed with exit code $NO_RETRY_EXIT"
    return "$NO_RETRY_EXIT"
  fi
  # The nodes answer through srun to this host, which writes their lines into $NODE_CHECK_LOG and the batch log:
  # a node that cannot see the trial directory could not write its own log there.
  run_node_checks --canary="$canary" --token="$token" --writer="$here" --address-file="$canary.address" 2>&1 |
    publish_address "$canary.address" | tee -a "$NODE_CHECK_LOG"
  rc=${PIPESTATUS[0]}
  rm -f "$canary" "$canary.address"
  if [ "$rc" -ne 0 ]; then
    echo "rlkit: the node check failed: $NODE_CHECK_LOG names each node that failed it and why"
    echo "rlkit: step node-check failed with exit code $NO_RETRY_EXIT"
    return "$NO_RETRY_EXIT"
  fi
  echo "rlkit: node check passed: every node sees the trial directory and the GPUs its component asked for, and" \
    "reaches the work component's first node"
}

run_node_checks() {  # run_node_checks ARG...: every component's node check at once; fails when any node's failed
  local fn pid rc=0 pids=()
  for fn in "${NODE_CHECKS[@]}"; do
    "$fn" "$@" &
    pids+=("$!")
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || rc=1
  done
  return "$rc"
}

publish_address() {  # publish_address FILE: pass the nodes' lines on; the listener's address line goes into FILE
  local line
  while IFS= read -r line || [ -n "$line" ]; do
    case $line in
      "$NODE_CHECK_ADDRESS_MARK "*) echo "${line#"$NODE_CHECK_ADDRESS_MARK "}" >"$1" ;;
      *) echo "$line" ;;
    esac
  done
}

@NODE_CHECKS@

if ! check_nodes; then
  echo "rlkit: batch script exits with $NO_RETRY_EXIT"
  exit "$NO_RETRY_EXIT"
fi

@STEPS@

supervise
status=$?
echo "rlkit: batch script exits with $status"
exit $status
