#!/usr/bin/env bash
# Ways a run could lose work, each checked end to end through `meshtron train`:
#   work_safety.sh CASE MESHTRON WORKDIR MPIEXEC [MPIEXEC ARGS...]
# CASE: final_save | nan_weights | sigterm_resume | disk_full | shared_save_dir |
#       unwritable_save_dir | zeroed_tail
# Exit 0 = pass, 77 = skipped (disk_full where no tmpfs can be mounted).
set -euo pipefail
case_name=$1 meshtron=$2 work=$3; shift 3
mpiexec=("$@")
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"

fail() { echo "FAIL: $*" >&2; exit 1; }
train() { "$meshtron" train "$here/tiny.deck" --set run.output_dir="$work/runs" "$@"; }
latest() { cat "$1/latest"; }
expect_files() {  # DIR FILE... : exactly these iter_*.h5, in order
  local dir=$1; shift
  local got; got=$(cd "$dir" && ls iter_*.h5 2>/dev/null | tr '\n' ' ')
  [[ "$got" == "$* " ]] || fail "$dir holds '$got', expected '$* '"
}

case $case_name in
final_save)
  # save_interval does not divide train_iters: the last step is saved anyway.
  train --set checkpoint.save_dir=ck --set checkpoint.save_interval=4 > out.txt
  expect_files ck iter_0000004.h5 iter_0000006.h5
  [[ $(latest ck) == iter_0000006.h5 ]] || fail "latest is $(latest ck)"
  # A fresh run into a folder holding newer checkpoints of another run keeps
  # what it has just written (and the other run's files).
  mkdir -p reused && cp ck/iter_0000006.h5 reused/iter_0000500.h5
  cp ck/iter_0000006.h5 reused/iter_0000400.h5
  train --set checkpoint.save_dir=reused --set checkpoint.keep_last=1 \
        --set training.train_iters=2 > out2.txt
  expect_files reused iter_0000002.h5 iter_0000400.h5 iter_0000500.h5
  [[ $(latest reused) == iter_0000002.h5 ]] || fail "latest is $(latest reused)"
  "$meshtron" inspect "reused/$(latest reused)" > /dev/null
  ;;
nan_weights)
  # check_for_nan off and a huge lr: step 2 makes the weights NaN. The save
  # is refused with one line, the run exits 1, the good checkpoint stays.
  status=0
  train --set checkpoint.save_dir=ck --set checkpoint.save_interval=1 --set checkpoint.keep_last=2 \
        --set optimizer.lr=1e38 --set optimizer.min_lr=1e38 --set training.check_for_nan=false \
        --set lr_schedule.warmup_iters=4 > out.txt 2> err.txt || status=$?
  [[ $status == 1 ]] || fail "exit status $status"
  grep -q "^meshtron: error: refusing to save iter_0000002.h5: parameter '.*' holds .*nan" err.txt ||
    fail "no refusal line: $(cat err.txt)"
  expect_files ck iter_0000001.h5
  [[ $(latest ck) == iter_0000001.h5 ]] || fail "latest is $(latest ck)"
  "$meshtron" inspect ck/iter_0000001.h5 > /dev/null
  ;;
sigterm_resume)
  # SIGTERM to one rank mid-run: every rank stops after the same step, saves,
  # exits 0; resuming gives the uninterrupted run's losses and weights.
  split_name="sigterm_split_$$"  # pgrep finds this run's ranks, no other test's
  common=(--set parallel.data_parallel=2 --set training.train_iters=150 --set checkpoint.save_interval=1000)
  "${mpiexec[@]}" -np 2 "$meshtron" train "$here/tiny.deck" --set run.output_dir="$work/runs" \
      --set run.name=whole --set checkpoint.save_dir=whole "${common[@]}" > whole.txt
  "${mpiexec[@]}" -np 2 "$meshtron" train "$here/tiny.deck" --set run.output_dir="$work/runs" \
      --set run.name="$split_name" --set checkpoint.save_dir=split "${common[@]}" > split.txt &
  launcher=$!
  for _ in $(seq 600); do  # until step 10 is logged
    [[ -f runs/$split_name/metrics.jsonl ]] && (( $(wc -l < runs/$split_name/metrics.jsonl) >= 10 )) && break
    sleep 0.1
  done
  rank_pid=$(pgrep -f "run.name=$split_name" | while read -r p; do
               [[ $(ps -o comm= -p "$p") == meshtron ]] && echo "$p"; done | tail -n 1)
  [[ -n "$rank_pid" ]] || fail "no rank process found"
  kill -TERM "$rank_pid"
  wait "$launcher" || fail "the signalled run exited with $?"
  grep -q "stopping after iteration [0-9]* of 150: received SIGTERM" split.txt || fail "no stop line"
  stopped=$(sed -n 's/.*stopping after iteration \([0-9]*\) of.*/\1/p' split.txt)
  (( stopped < 150 )) || fail "the run was not interrupted"
  [[ $(latest split) == $(printf 'iter_%07d.h5' "$stopped") ]] || fail "latest is $(latest split)"
  "${mpiexec[@]}" -np 2 "$meshtron" train "$here/tiny.deck" --set run.output_dir="$work/runs" \
      --set run.name="$split_name" --set checkpoint.save_dir=split --set checkpoint.load=auto \
      "${common[@]}" > resumed.txt
  python3 "$here/compare_losses.py" runs/whole/metrics.jsonl "runs/$split_name/metrics.jsonl" 1 150 0
  h5diff whole/iter_0000150.h5 split/iter_0000150.h5 /model /model
  ;;
disk_full)
  # A tmpfs with room for one checkpoint, not two: the second save fails
  # with one line, no temporary file stays, the first checkpoint is intact.
  mkdir -p fs
  if ! mount -t tmpfs -o size=2000k tmpfs fs 2>/dev/null; then
    echo "SKIP: cannot mount a tmpfs here"; exit 77
  fi
  trap 'umount "$work/fs"' EXIT
  status=0
  train --set checkpoint.save_dir=fs/ck --set checkpoint.save_interval=3 > out.txt 2> err.txt || status=$?
  [[ $status == 1 ]] || fail "exit status $status"
  [[ $(grep -c . err.txt) == 1 ]] || fail "expected one line on stderr: $(cat err.txt)"
  grep -q "^meshtron: error: no space for checkpoint fs/ck/iter_0000006.h5" err.txt || fail "$(cat err.txt)"
  [[ -z $(ls -A fs/ck | grep tmp || true) ]] || fail "a temporary file stayed: $(ls -A fs/ck)"
  expect_files fs/ck iter_0000003.h5
  [[ $(latest fs/ck) == iter_0000003.h5 ]] || fail "latest is $(latest fs/ck)"
  "$meshtron" inspect fs/ck/iter_0000003.h5 > /dev/null
  ;;
shared_save_dir)
  # A live run (this script's shell) holds the folder: a second run stops
  # before step 1 and names it; a lock whose process is gone is taken over.
  mkdir -p ck && echo "$(hostname) $$ " > ck/.lock
  status=0
  train --set checkpoint.save_dir=ck > out.txt 2> err.txt || status=$?
  [[ $status == 1 ]] || fail "exit status $status"
  grep -q "^meshtron: error: checkpoint folder 'ck' is in use by another run (host $(hostname), pid $$)" err.txt ||
    fail "$(cat err.txt)"
  ! grep -q "iteration *1/" out.txt || fail "the run trained before refusing"
  sleep 0.1 & dead=$!; wait $dead
  echo "$(hostname) $dead " > ck/.lock
  train --set checkpoint.save_dir=ck > out2.txt
  expect_files ck iter_0000006.h5
  [[ ! -e ck/.lock ]] || fail "the lock stayed after the run"
  ;;
unwritable_save_dir)
  touch a_file
  status=0
  "${mpiexec[@]}" -np 2 "$meshtron" train "$here/tiny.deck" --set run.output_dir="$work/runs" \
      --set parallel.data_parallel=2 --set checkpoint.save_dir=a_file/ck > out.txt 2> err.txt || status=$?
  [[ $status == 1 ]] || fail "exit status $status"
  grep -q "^meshtron: error: checkpoint.save_dir 'a_file/ck' cannot be created" err.txt || fail "$(cat err.txt)"
  ! grep -q "iteration *1/" out.txt || fail "the run trained before refusing"
  status=0
  "$meshtron" train "$here/tiny.deck" --set checkpoint.save_dir=ck --set run.output_dir=a_file/runs \
      > out2.txt 2> err2.txt || status=$?
  [[ $status == 1 ]] || fail "exit status $status"
  grep -q "^meshtron: error: run.output_dir 'a_file/runs/tiny-test' cannot be created" err2.txt || fail "$(cat err2.txt)"
  ;;
zeroed_tail)
  # The file's last 64 KiB zeroed: inspect names the damaged datasets.
  train --set checkpoint.save_dir=ck --set training.train_iters=2 > out.txt
  size=$(stat -c %s ck/iter_0000002.h5)
  dd if=/dev/zero of=ck/iter_0000002.h5 bs=1 seek=$((size - 65536)) count=65536 conv=notrunc 2>/dev/null
  status=0
  "$meshtron" inspect ck/iter_0000002.h5 > inspect.txt || status=$?
  [[ $status == 1 ]] || fail "inspect exit status $status: $(tail -1 inspect.txt)"
  grep -q "^checksum: FAILED in [0-9]* of [0-9]* datasets" inspect.txt || fail "$(tail -1 inspect.txt)"
  ;;
*) fail "unknown case $case_name" ;;
esac
echo "$case_name: ok"
