#!/bin/bash
# keelrl's CUDA path on one GPU: configs/smoke.toml (a random tiny model, 8 steps) trained on cuda in fp32,
# then with bf16 autocast + torch.compile and recomputed old log-probs (so the sampler/trainer log-prob
# mismatch is measured). Each run's log goes to $LOGS (default: the current directory); run directories
# under $RUNS. The summary in docs/cuda_smoke.json was made from the two runs' metrics.jsonl.
#   bash benchmarks/cuda_smoke.sh
RUNS=${RUNS:-/tmp/keelrl_cuda_smoke} LOGS=${LOGS:-.}
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'" || exit 1
run() {  # name, timeout in seconds, overrides...
  local name=$1 secs=$2; shift 2
  timeout "$secs" python3 -m keelrl train configs/smoke.toml --set train.device=cuda --set train.steps=8 "$@" \
    --run-dir "$RUNS/$name" > "$LOGS/$name.log" 2>&1
  echo "== $name: exit $?"; tail -3 "$LOGS/$name.log"
}
run fp32 150
run bf16_compile 300 --set train.autocast=bf16 --set train.compile=true --set algo.old_logprobs=recompute
