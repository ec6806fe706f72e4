# Steps under time limits that end their whole process tree; sourced by tools/gpu_first.sh and
# tools/gpu_report.sh (not run on its own).
#
# A step runs as the leader of a process group of its own (setpgid, through `python3 -S`; not a new
# session: the device ends a command's leftover processes when it returns, except those in a session
# of their own). The step's tree -- that group, plus every descendant of its first process, should one
# move to another group -- is what its limit ends: when the limit passes, every live process of the
# tree gets SIGTERM, then, after GS_GRACE_S seconds, SIGKILL, whether or not the step's first process
# is still there (the deepspeed runner dies at once on SIGTERM while its worker traps it to save: a
# watchdog on the runner alone, as `timeout -k` was, never sends the KILL, and the next step starts
# beside the last one's GPU memory). A step that ends by itself but leaves processes behind has them
# ended the same way, and the runner waits until none is left. If the script itself is stopped
# (SIGTERM, SIGINT, SIGHUP) or exits, the running step's tree is ended first.
#
# The caller sets, before calling these functions:
#   STEPS_TSV   one line per step: id, status, exit code, seconds, limit, command (tools/bench_report.py)
#   STEP_LOGS   folder of the step logs (ID.log)
#   START       epoch seconds the run started;  BUDGET  seconds the whole run may take
#   RESERVE     seconds kept at the end (report);  MIN_STEP_S  no step starts with less than this left
#   CAP_SCALE   multiplies every step's cap (a loaded CPU in the smoke runs)
# and may set GS_NAME (log prefix), GS_GRACE_S (10), GS_STREAM (1: copy each step's output to stdout
# while it runs, so a log tee'd from stdout has it the moment it is written), GPU_STEPS_ONLY
# (id,id,...: run only these steps; the others are recorded as skipped).

GS_NAME=${GS_NAME:-gpu}
GS_GRACE_S=${GS_GRACE_S:-10}
GS_STREAM=${GS_STREAM:-0}
GS_SHOW=${GS_SHOW:-}
TRAIN_FAILED=          # the id of the first training step that failed (fail-fast)

gs_log() { printf '[%s %s +%ss] %s\n' "$GS_NAME" "$(date -u +%H:%M:%S)" "$(( $(date +%s) - ${START:-$(date +%s)} ))" "$*"; }
gs_now() { date +%s.%N; }
gs_ms() {  # milliseconds since the epoch (bash 5's EPOCHREALTIME; date elsewhere)
  if [ -n "${EPOCHREALTIME:-}" ]; then
    local t=${EPOCHREALTIME/[.,]/}
    echo $(( t / 1000 ))
  else
    date +%s%3N
  fi
}
gs_elapsed() { awk -v a="$1" -v b="$(gs_now)" 'BEGIN { printf "%.1f", b - a }'; }
gs_left() { echo $(( START + BUDGET - RESERVE - $(date +%s) )); }

record() {  # record ID STATUS RC WALL_S LIMIT_S COMMAND: one line of steps.tsv
  local command=${6//$'\t'/ }
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "${command//$'\n'/ }" >> "$STEPS_TSV"
}

selected() { [ -z "${GPU_STEPS_ONLY:-}" ] || [[ ",$GPU_STEPS_ONLY," == *",$1,"* ]]; }

limit_for() {  # limit_for CAP_S: the step's limit (CAP_S x CAP_SCALE), bounded by what is left of the budget
  local cap=$(( $1 * CAP_SCALE )) left
  left=$(gs_left)
  echo $(( cap < left ? cap : left ))
}

tree_members() {  # tree_members PGID: the live (not zombie) processes of group PGID and the descendants of PGID
  local stat line rest state ppid pgrp pid changed
  local -A parent=() member=()
  for stat in /proc/[0-9]*/stat; do
    { read -r line < "$stat"; } 2>/dev/null || continue
    pid=${line%% *}
    rest=${line##*) }  # the fields after "pid (comm)": state ppid pgrp ...
    read -r state ppid pgrp _ <<< "$rest"
    { [ "$state" = Z ] || [ "$state" = X ]; } && continue
    parent[$pid]=$ppid
    { [ "$pgrp" = "$1" ] || [ "$pid" = "$1" ]; } && member[$pid]=1
  done
  changed=1
  while [ $changed = 1 ]; do  # descendants of the group's processes, whatever group they moved to
    changed=0
    for pid in "${!parent[@]}"; do
      if [ -z "${member[$pid]:-}" ] && [ -n "${member[${parent[$pid]}]:-}" ]; then
        member[$pid]=1
        changed=1
      fi
    done
  done
  for pid in "${!member[@]}"; do echo "$pid"; done
}

signal_tree() {  # signal_tree SIG PGID: send SIG to every live process of the step's tree; 1 if none was left
  local pids pid
  pids=$(tree_members "$2")
  [ -n "$pids" ] || return 1
  for pid in $pids; do kill "-$1" "$pid" 2>/dev/null; done
  return 0
}

wait_tree_gone() {  # wait_tree_gone PGID SECONDS: 0 once the step's tree has no live process, 1 if some remain
  local until_ms=$(( $(gs_ms) + $2 * 1000 ))
  while [ -n "$(tree_members "$1")" ]; do
    [ "$(gs_ms)" -lt "$until_ms" ] || return 1
    sleep 0.2
  done
}

end_tree() {  # end_tree PGID: TERM, GS_GRACE_S seconds, KILL, until nothing of the step's tree is left
  signal_tree TERM "$1" || return 0
  wait_tree_gone "$1" "$GS_GRACE_S" && return 0
  gs_log "step processes still running $GS_GRACE_S s after SIGTERM: SIGKILL to $(tree_members "$1" | tr '\n' ' ')"
  local tries
  for tries in 1 2 3 4 5; do  # a process forking while it is killed: again until none is left
    signal_tree KILL "$1" || return 0
    wait_tree_gone "$1" 2 && return 0
  done
  gs_log "step processes left after SIGKILL: $(tree_members "$1" | tr '\n' ' ')"
  return 1
}

GS_RUNNING=  # the process group of the step running now (ended if the script stops)
gs_stop() {  # on the script's exit or a stop signal: end the running step's tree
  if [ -n "$GS_RUNNING" ]; then
    local grace=$GS_GRACE_S
    GS_GRACE_S=2
    end_tree "$GS_RUNNING" 2>/dev/null
    GS_GRACE_S=$grace
    GS_RUNNING=
  fi
}
trap 'gs_stop' EXIT
trap 'gs_log "stopped by a signal: ending the running step"; gs_stop; exit 143' TERM INT HUP

GS_OFF=0
gs_stream() {  # gs_stream LOG: print what LOG gained since the last call (GS_OFF bytes were printed)
  local size
  size=$(stat -c %s "$1" 2>/dev/null) || return 0
  if [ "$size" -gt "$GS_OFF" ]; then
    tail -c "+$(( GS_OFF + 1 ))" "$1" | head -c "$(( size - GS_OFF ))"
    GS_OFF=$size
  fi
}

run_bounded() {  # run_bounded LIMIT_S LOG COMMAND...: COMMAND as a process group of its own, output in LOG;
  # its exit code, or 124 when the limit ended it (its whole tree: TERM, grace, KILL). Leftovers are ended either way.
  local limit=$1 log=$2
  shift 2
  "${GS_PYTHON:-python3}" -S -c 'import os, sys; os.setpgid(0, 0); os.execvp(sys.argv[1], sys.argv[1:])' "$@" \
      > "$log" 2>&1 < /dev/null &
  local pid=$! rc timed_out=0 deadline=$(( $(gs_ms) + limit * 1000 ))
  GS_RUNNING=$pid
  GS_OFF=0
  while kill -0 "$pid" 2>/dev/null; do
    [ "$GS_STREAM" = 1 ] && gs_stream "$log"
    if [ "$(gs_ms)" -ge "$deadline" ]; then
      timed_out=1
      break
    fi
    sleep 0.25
  done
  if [ $timed_out = 1 ]; then
    gs_log "limit of $limit s reached: ending the step's processes (SIGTERM, then SIGKILL after $GS_GRACE_S s)"
    end_tree "$pid"
    wait "$pid" 2>/dev/null
    rc=124
  else
    wait "$pid"
    rc=$?
    if [ -n "$(tree_members "$pid")" ]; then
      gs_log "the step exited (code $rc) but left processes: $(tree_members "$pid" | tr '\n' ' '); ending them"
      end_tree "$pid"
    fi
  fi
  GS_RUNNING=
  [ "$GS_STREAM" = 1 ] && gs_stream "$log"
  return $rc
}

run_step() {  # run_step ID CAP_S COMMAND...: COMMAND under its limit, output in STEP_LOGS/ID.log; 0 if it succeeded
  local id=$1 cap=$2
  shift 2
  local cmd=${GS_SHOW:-$*}  # GS_SHOW: how the log and steps.tsv show the command (default: as given)
  GS_SHOW=
  if ! selected "$id"; then record "$id" "skipped: not selected" "" 0 0 "$cmd"; return 0; fi
  local limit
  limit=$(limit_for "$cap")
  if [ "$limit" -lt "$MIN_STEP_S" ]; then
    gs_log "$id: skipped (out of time: $limit s left)"
    record "$id" "skipped: out of time" "" 0 0 "$cmd"
    return 0
  fi
  gs_log "$id (limit ${limit} s): $cmd"
  local t0 rc status
  t0=$(gs_now)
  run_bounded "$limit" "$STEP_LOGS/$id.log" "$@"
  rc=$?
  case $rc in
    0) status=ok ;;
    124) status="timed out" ;;
    *) status=failed ;;
  esac
  gs_log "$id: $status (exit code $rc, $(gs_elapsed "$t0") s)"
  record "$id" "$status" "$rc" "$(gs_elapsed "$t0")" "$limit" "$cmd"
  [ $rc = 0 ]
}

enough_time() {  # enough_time ID MIN_S: 0 if at least MIN_S seconds (x CAP_SCALE) are left; else records ID as skipped
  local need=$(( $2 * CAP_SCALE )) left
  left=$(gs_left)
  [ "$left" -ge "$need" ] && return 0
  gs_log "$1: skipped (out of time: $left s left, it needs $need s to give a figure)"
  record "$1" "skipped: out of time ($left s left, needs $need s)" "" 0 0 ""
  return 1
}

train_step() {  # train_step ID CAP_S COMMAND...: run_step, unless a training step failed before (fail-fast)
  local id=$1
  if [ -n "$TRAIN_FAILED" ]; then
    gs_log "$id: skipped (fail-fast: training step $TRAIN_FAILED failed)"
    record "$id" "skipped: training step $TRAIN_FAILED failed (fail-fast)" "" 0 0 "${*:3}"
    return 1
  fi
  run_step "$@" && return 0  # a step that did not run (not selected, out of time) returns 0 too
  TRAIN_FAILED=$id
  return 1
}

step_status() {  # step_status ID: the status steps.tsv holds for ID (empty if none)
  awk -F'\t' -v id="$1" '$1 == id { s = $2 } END { print s }' "$STEPS_TSV"
}

free_port() { "$PY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }

build_data() {  # build_data DATA SCRATCH WORKERS CORPUS_ARGS...: generated corpus (SCRATCH/corpus) -> byte-level BPE
  # tokenizer trained on it (DATA/tokenizer, 2048 ids) -> indexed dataset DATA/corpus.{bin,idx}: the layout the
  # scripts read, the one tools/gpu_wheels.sh carries in .gpu/data. Run as a step: run_step data CAP bash -c ...
  local data=$1 scratch=$2 workers=$3
  shift 3
  "$PY" tools/make_corpus.py --output-dir "$scratch/corpus" --seed 0 "$@" &&
  "$PY" tools/train_tokenizer.py --input "$scratch/corpus/train.jsonl" --output "$data/tokenizer" --vocab-size 2048 &&
  "$PY" tools/preprocess_data.py --input "$scratch/corpus/train.jsonl" --tokenizer "$data/tokenizer" \
      --output-prefix "$data/corpus" --workers "$workers" --no-progress
}

data_step() {  # data_step CAP_S DATA SCRATCH WORKERS CORPUS_ARGS...: build_data as a step (id data), under its limit
  local cap=$1
  shift
  GS_SHOW="make_corpus.py --output-dir $2/corpus --seed 0 ${*:4}; train_tokenizer.py --output $1/tokenizer --vocab-size 2048; preprocess_data.py --output-prefix $1/corpus --workers $3"
  run_step data "$cap" bash -c "$(declare -f build_data); PY=$(printf %q "$PY"); build_data \"\$@\"" build_data "$@"
}

prepared_data() {  # prepared_data DIR: 0 if DIR holds corpus.idx/.bin and tokenizer/tokenizer.json
  [ -f "$1/corpus.idx" ] && [ -f "$1/corpus.bin" ] && [ -f "$1/tokenizer/tokenizer.json" ]
}

