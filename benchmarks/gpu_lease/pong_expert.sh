#!/usr/bin/env bash
# On the lent GPU machine, from the repository root, with .gpu/ made by bundle.sh from pong-expert and pong-random,
# in one call of the device tool (at most 600 s): the GPU tests, the training throughput against the plain torch
# loop on pong-random, then BC (two seeds) and conservative DQN on pong-expert at batches of 256, three
# quality_table runs at once, each learner training for SECONDS. Logs and quality tables land in $OUT (8 files:
# what the device tool brings back). The rows of "On an H200" in benchmarks/atari.md came from this script at
# 1d1ccd6 (four BC and DQN runs, no throughput).
#   bash benchmarks/gpu_lease/pong_expert.sh SECONDS
set -u
budget=$1
ends=$((SECONDS + 575))  # every run stopped in time for the device tool to bring $OUT back
mkdir -p /tmp/site /tmp/q
[ -d /tmp/site/ray ] || tar -xJf .gpu/site312.tar.xz -C /tmp/site || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c "import ray, gymnasium, ale_py, torch, pyarrow, numpy, pandas
print('ray', ray.__version__, 'torch', torch.__version__, 'pyarrow', pyarrow.__version__, 'numpy', numpy.__version__,
      'pandas', pandas.__version__, 'cuda', torch.cuda.is_available())" || exit 1

timeout 150 python3 benchmarks/training_throughput.py --params params.yaml --dataset .gpu/datasets/pong-random \
    --algos bc dqn --iterations 10 --gpus-per-learner 1 --memory-cache-mib 8192 >"$OUT/throughput.log" 2>&1
echo "throughput exit $?"

table() {  # the run's name, then quality_table's arguments
    local name=$1
    shift
    timeout $((ends - SECONDS)) python3 benchmarks/quality_table.py --params .gpu/params.yaml \
        --datasets-dir .gpu/datasets --references .gpu/references --datasets pong-expert --no-d3rlpy \
        --train-seconds "$budget" --out "/tmp/q/$name" "$@" >"$OUT/$name.log" 2>&1
    echo "$name exit $?"
    cp "/tmp/q/$name/quality.json" "$OUT/$name.json"
}
table bc256-s0 --algos bc --seeds 0 --set batch_size=256 lr=0.00025 iterations=1000 &
table bc256-s1 --algos bc --seeds 1 --set batch_size=256 lr=0.00025 iterations=1000 &
table cql_dqn256-s0 --algos cql_dqn --seeds 0 --set batch_size=256 iterations=1000 &
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/training/test_gpu.py >"$OUT/test_gpu.log" 2>&1 &
wait
grep -h "samples/s\|\[quality\]\|Error\|passed\|failed\|^| " "$OUT"/*.log
