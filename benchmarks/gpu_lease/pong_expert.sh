#!/usr/bin/env bash
# On the lent GPU machine, from the repository root, with .gpu/ made by bundle.sh from a pong-expert dataset:
# BC and conservative DQN on it, four quality_table runs at once, each learner training for SECONDS. Logs and
# quality tables land in $OUT (8 files: what the device tool brings back).
#   bash benchmarks/gpu_lease/pong_expert.sh SECONDS
set -u
budget=$1
mkdir -p /tmp/site /tmp/q
[ -d /tmp/site/ray ] || tar -xJf .gpu/site312.tar.xz -C /tmp/site || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c "import ray, gymnasium, ale_py, torch, pyarrow, numpy, pandas
print('ray', ray.__version__, 'torch', torch.__version__, 'pyarrow', pyarrow.__version__, 'numpy', numpy.__version__,
      'pandas', pandas.__version__, 'cuda', torch.cuda.is_available())" || exit 1

table() {  # the run's name, then quality_table's arguments
    local name=$1
    shift
    timeout $((budget + 280)) python3 benchmarks/quality_table.py --params .gpu/params.yaml \
        --datasets-dir .gpu/datasets --references .gpu/references --datasets pong-expert --no-d3rlpy \
        --train-seconds "$budget" --out "/tmp/q/$name" "$@" >"$OUT/$name.log" 2>&1
    echo "$name exit $?"
    cp "/tmp/q/$name/quality.json" "$OUT/$name.json"
}
table bc256-s0 --algos bc --seeds 0 --set batch_size=256 lr=0.00025 iterations=1000 &
table bc256-s1 --algos bc --seeds 1 --set batch_size=256 lr=0.00025 iterations=1000 &
table bc-suite --algos bc --seeds 0 &
table cql_dqn-suite --algos cql_dqn --seeds 0 &
wait
grep -h "samples/s\|\[quality\]\|Error" "$OUT"/*.log
