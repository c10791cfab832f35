#!/usr/bin/env bash
# Packs into .gpu/ (git-ignored) what a benchmark needs on a machine lent by the `device` tool: Python 3.12 with
# torch, numpy, pandas, pyarrow and matplotlib, but no Ray, gymnasium or ale-py, and no network. It travels with the
# working tree (`carry: [".gpu"]`; 64 MiB in all, the tracked files included):
#   site312.tar.xz  the missing packages at requirements.lock's versions, their cp312 wheels unpacked, Ray's Java jars
#                   and dashboard build left out (37 MB), and a dist-info that gives this project's version
#   datasets/NAME   the datasets, collected here (Pong's frames: about 160 bytes a transition on disk)
#   references/     their envs' references, measured here (`orl reference`)
#   params.yaml     benchmarks/atari/params.yaml for three or four quality_table runs at once on the lent machine
# Run from the repository root, in its virtualenv:
#   bash benchmarks/gpu_lease/bundle.sh REFERENCES_DIR DATASET_DIR...
set -euo pipefail
references=$1
shift
missing="ray gymnasium ale-py farama-notifications dm-tree lz4 ormsgpack tensorboardx jsonschema
         jsonschema-specifications referencing rpds-py pydantic pydantic-core annotated-types typing-inspection"
rm -rf .gpu && mkdir -p .gpu/wheels .gpu/site .gpu/datasets
for name in $missing; do
    pin=$(grep -i "^${name//-/[-_]}==" requirements.lock | cut -d' ' -f1)
    python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .gpu/wheels "$pin"
done
for wheel in .gpu/wheels/*.whl; do unzip -q -o "$wheel" -d .gpu/site; done
rm -rf .gpu/site/ray/jars .gpu/site/ray/dashboard/client
version=$(python -c "from importlib import metadata; print(metadata.version('offline-rl-pipeline'))")
info=.gpu/site/offline_rl_pipeline-$version.dist-info  # datasets record the code's version (common/code_version.py)
mkdir -p "$info"
printf 'Metadata-Version: 2.1\nName: offline-rl-pipeline\nVersion: %s\n' "$version" >"$info/METADATA"
tar -C .gpu/site -cf - . | xz -T0 -6 >.gpu/site312.tar.xz
rm -rf .gpu/wheels .gpu/site
cp -r "$@" .gpu/datasets/ && cp -r "$references" .gpu/references
python - <<'PY'
import yaml

params = yaml.safe_load(open("benchmarks/atari/params.yaml"))
params["ray"]["num_cpus"] = 4  # each of the runs at once starts its own local Ray
params["evaluate"]["num_workers"] = 4
for algo in ("bc", "cql_dqn"):  # on the GPU, the carried dataset held in memory
    params["algos"][algo] |= {"num_gpus_per_learner": 1, "memory_cache_mib": 8192}
yaml.safe_dump(params, open(".gpu/params.yaml", "w"), sort_keys=False)
PY
du -sh .gpu
