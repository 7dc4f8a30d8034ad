#!/bin/bash
# Issue 30's one prepared GPU check, in one call of at most ~8 minutes on one GPU:
#   0. the hf engine's decode, eager against graph (a compiled step, CUDA graphs), at batch 512 on a 358M model of
#      Qwen2.5-0.5B's trunk shape, and that model's RL update profiled (benchmarks/gpu_decode.py; issue 48);
#   1. learning: the demo's RL stage on CUDA (bf16 autocast, the hf engine's default decode there: graph) from the
#      demo's base model carried along, at batch 512 (the CPU's 128 was run on a GPU before: docs/RESULTS.md); the
#      final policy against the base on the same 500 held-out problems, greedy, paired interval (keelrl compare);
#   2. fault drill: the same stage under torchrun (one rank: NCCL + FSDP2) and the supervisor, uninterrupted and
#      with a SIGKILL of the worker mid-run (the supervisor resumes it from its checkpoint); what is and is not
#      bit-identical between the two goes to fault_drill.json;
#   3. throughput: benchmarks/gpu_throughput.py at batch 512 and 2048 (steps/s, generation and update tokens/s,
#      peak GPU memory);
#   4. the `gpu`-marked tests (tests/gpu), run second (after part 0): they are quick.
# Results: OUT/gpu_check.json (everything above, rewritten after every part: a call cut short keeps what ran) and
# one log per part in OUT/.
#   bash benchmarks/gpu_check.sh OUT --base runs/demo/base       # on the GPU machine (carry the base: ~4 MB)
#   bash benchmarks/gpu_check.sh OUT --dry-run                   # here, on CPU: tiny sizes, a base made in ~30 s
set -u
OUT=${1:?usage: gpu_check.sh OUT [--base DIR] [--dry-run]}
shift
DRY=0 BASE=""
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) DRY=1 ;;
    --base) BASE=$2; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
PY=${PYTHON:-python3}
mkdir -p "$OUT"
if [ "$DRY" = 1 ]; then
  DEV=cpu AC=off BACKEND=gloo STEPS=4 EVALN=40 SMALL=16 BIG=32 KSTEPS=8 KAT=4 TPB=16,32 TPSTEPS=3 T=300
else
  DEV=cuda AC=bf16 BACKEND=nccl STEPS=100 EVALN=500 SMALL="" BIG=512 KSTEPS=30 KAT=14 TPB=512,2048 TPSTEPS=6 T=150
  "$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'" || exit 1
fi
if [ -z "$BASE" ]; then
  [ "$DRY" = 1 ] || { echo "--base DIR (the demo's base model) is required on the GPU machine" >&2; exit 2; }
  "$PY" -m keelrl.ladder.pretrain_run configs/ladder_pretrain_tiny.toml --run-dir "$OUT/base_run" \
    --set ladder.pretrain_steps=30 --set ladder.pretrain_batch=16 --set ladder.heldout_lines=16 > "$OUT/base.log" 2>&1
  BASE=$OUT/base_run/final
fi
TASK=(--task countdown --template compact --max-new-tokens 24 --problems "$EVALN" --device "$DEV"
      --task-param min_numbers=2 --task-param max_numbers=2 --task-param max_number=50
      --task-param max_target=2500 --task-param test_fraction=0.3)
RL=(configs/countdown_tiny.toml --set "model.path=\"$BASE\"" --set "train.device=\"$DEV\""
    --set "train.autocast=\"$AC\"" --set log.progress=false --set eval.problems=100)

# 0. decode and update at a real model's shape (first: the newest question)
if [ "$DRY" = 1 ]; then DECODE=(--quick); else DECODE=(--device "$DEV"); fi
timeout $(( T * 2 )) "$PY" benchmarks/gpu_decode.py "${DECODE[@]}" --out "$OUT/decode.json" > "$OUT/decode.log" 2>&1
echo "== decode and update profile: exit $?"
summarize() { "$PY" benchmarks/gpu_check_report.py summary "$OUT" "$DEV" "$DRY" > "$OUT/gpu_check.json"; }
summarize

# 4. the gpu-marked tests
timeout $T "$PY" -m pytest tests/gpu -m gpu -q -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
echo "== gpu tests: exit $? ($(tail -n 1 "$OUT/gpu_tests.log"))"
summarize

# 1. learning (the dry run: at two batch sizes)
for B in $SMALL $BIG; do
  MB=$(( B < 128 ? B : 128 ))
  timeout $T "$PY" -m keelrl train "${RL[@]}" --run-dir "$OUT/rl_b$B" --set train.steps=$STEPS \
    --set rollout.batch_size=$B --set train.micro_batch_size=$MB --set eval.every_steps=$(( STEPS / 2 )) \
    --set checkpoint.every_steps=$(( STEPS / 2 )) > "$OUT/rl_b$B.log" 2>&1
  echo "== learning, batch $B: exit $?"
  timeout $T "$PY" -m keelrl compare "$BASE" "$OUT/rl_b$B/final" "${TASK[@]}" --json --out "$OUT/compare_b$B.json" \
    > "$OUT/compare_b$B.log" 2>&1
  echo "== compare, batch $B: exit $?"
  summarize
done

# 2. torchrun (one rank, NCCL + FSDP2) under the supervisor: uninterrupted, then SIGKILL of the worker mid-run
DRILL=(--torchrun --set distributed.strategy=\"fsdp2\" --set distributed.backend=\"$BACKEND\"
       --set train.steps=$KSTEPS --set checkpoint.every_steps=2 --set eval.every_steps=0)
timeout $T "$PY" -m keelrl train "${RL[@]}" "${DRILL[@]}" --run-dir "$OUT/fsdp_ref" > "$OUT/fsdp_ref.log" 2>&1
echo "== fsdp2 reference: exit $?"
timeout $T "$PY" -m keelrl train "${RL[@]}" "${DRILL[@]}" --run-dir "$OUT/fsdp_kill" > "$OUT/fsdp_kill.log" 2>&1 &
TRAIN=$!
KILLED=0
for _ in $(seq 1 $(( T * 5 ))); do
  STEP=$(tail -n 1 "$OUT/fsdp_kill/metrics.jsonl" 2>/dev/null | "$PY" -c "import json,sys; print(json.loads(sys.stdin.read() or '{}').get('step', 0))" 2>/dev/null || echo 0)
  if [ "${STEP:-0}" -ge $KAT ]; then
    for PID in $(pgrep -f "keelrl worker.*$OUT/fsdp_kill"); do  # the rank, not torchrun's agent
      grep -q torch.distributed.run "/proc/$PID/cmdline" 2>/dev/null || { kill -KILL "$PID" && KILLED=$STEP; }
    done
    break
  fi
  sleep 0.2
done
wait $TRAIN
echo "== fsdp2 with SIGKILL of the worker after step $KILLED: exit $?"
"$PY" benchmarks/gpu_check_report.py drill "$OUT/fsdp_ref" "$OUT/fsdp_kill" "$KILLED" > "$OUT/fault_drill.json"
summarize

# 3. throughput
timeout $T "$PY" benchmarks/gpu_throughput.py --base "$BASE" --device "$DEV" --batch-sizes $TPB --steps $TPSTEPS \
  --out "$OUT/throughput.json" > "$OUT/throughput.log" 2>&1
echo "== throughput: exit $?"

summarize
echo "== summary: $OUT/gpu_check.json"
