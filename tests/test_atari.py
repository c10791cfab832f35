"""Atari through `orl`, sized for CI: ALE/Pong-v5 with AtariPreprocessing and a 4-frame stack collects uint8 frames,
BC and DQN train CNNs on them, BC is evaluated, its MLflow model predicts from a batch of frames, and OPE estimates it
through a CNN of its own."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

import dataset_format as dataset
from dataset_format import Col
from evaluation.config import OPEConfig
from evaluation.ope import UNRELIABLE
from tests.conftest import REPO, assert_minari_round_trip, orl

pytestmark = pytest.mark.slow  # Atari emulators and CNNs, through several `orl` commands

PONG = {"id": "ALE/Pong-v5", "import": ["ale_py"], "kwargs": {"frameskip": 1},  # AtariPreprocessing skips frames
        "wrappers": ["AtariPreprocessing", {"FrameStackObservation": {"stack_size": 4}}],
        "max_episode_steps": 400}  # emulator frames: about 100 agent steps
TINY = {"iterations": 2, "updates_per_iteration": 5, "batch_size": 32}


def run_orl(*args: str, cwd: Path) -> str:
    result = orl(*args, cwd=cwd, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("atari")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["datasets"] = {"pong": {"env": PONG, "episodes": 4, "seed": 0, "policy": {"kind": "random"}}}
    params["policy_datasets"], params["train"]["runs"] = {}, {}
    params["collect"].update(num_collectors=2, envs_per_collector=2, episodes_per_task=2)
    for algo in ("bc", "dqn"):
        params["algos"][algo].update(TINY)
    params["evaluate"].update(episodes=2)
    params["ope"].update(iterations=3, updates_per_iteration=2, batch_size=16, bootstrap_samples=20)
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    log = run_orl("collect", "pong", cwd=root)
    assert "A.L.E" not in log  # the emulator's banner is no progress line of ours
    run_orl("reference", "--out", "references", cwd=root)  # evaluate and ope read it
    for algo in ("bc", "dqn"):
        run_orl("train", "--algo", algo, "--dataset", "datasets/pong", "--out", f"runs/{algo}", cwd=root)
    return root


def test_frames_are_stored_as_uint8_at_a_few_bytes_per_transition(workdir):
    path = workdir / "datasets" / "pong"
    card = dataset.validate(path)
    assert card.observation_space == {"type": "Box", "shape": [4, 84, 84], "dtype": "uint8", "low": 0.0,
                                      "high": 255.0}
    schema = pq.read_schema(path / card.files[0]["path"])
    assert schema.field(Col.OBS).type == dataset.arrow_schema(*card.spaces, False).field(Col.OBS).type  # 4 frames
    on_disk = sum(f.stat().st_size for f in path.glob("*.parquet")) / card.transitions
    arrays = dataset.load_arrays(path)
    as_arrays = (arrays[Col.OBS].nbytes + arrays[Col.NEW_OBS].nbytes) / card.transitions
    frames, _ = dataset.read_frames(path, channels_first=True)  # as training holds them
    held = frames.nbytes / card.transitions
    print(f"\nPong, 4 stacked 84x84 frames, bytes per transition: {on_disk:,.0f} on disk (zstd), {as_arrays:,.0f} "
          f"read as arrays (obs and new_obs, uint8), {held:,.0f} held by training (each distinct frame once)")
    assert as_arrays == 2 * 4 * 84 * 84 and on_disk < as_arrays / 10 and held < 1.2 * 84 * 84


@pytest.mark.parametrize("algo", ["bc", "dqn"])
def test_learners_build_a_cnn_over_channels_last_frames(workdir, algo):
    from common.trained_policy import load_rl_module

    module = load_rl_module(workdir / "runs" / algo / "checkpoint")
    assert module.observation_space.shape == (84, 84, 4)
    assert "TorchCNNEncoder" in {type(m).__name__ for m in module.modules()}


def test_bc_is_evaluated_in_the_env_and_its_mlflow_model_predicts_from_frames(workdir, tracking_uri):
    import mlflow.pyfunc

    run_orl("evaluate", "runs/bc", "--references", "references", cwd=workdir)
    metrics = json.loads((workdir / "runs" / "bc" / "eval.json").read_text())
    assert metrics["episodes"] == 2 and "no ceiling reference" in metrics["no_normalized_score"]

    info = json.loads((workdir / "runs" / "bc" / "run.json").read_text())
    assert info["registered_model"]["name"] == "ALE-Pong-v5-bc"  # a registered model's name takes no "/"
    tracking_uri(f"sqlite:///{workdir / 'mlflow.db'}")
    model = mlflow.pyfunc.load_model(info["registered_model"]["uri"])
    actions = model.predict(dataset.load_arrays(workdir / "datasets" / "pong")[Col.OBS][:5].reshape(5, 4, 84, 84))
    assert actions.shape == (5,) and set(actions.tolist()) <= set(range(6))


def test_ope_estimates_a_policy_on_frames_through_a_cnn(workdir):
    log = run_orl("ope", "runs/bc", "--dataset", "datasets/pong", "--references", "references", cwd=workdir)
    ope = json.loads((workdir / "runs" / "bc" / "ope.json").read_text())
    assert ope["units"] == "return" and ope["fqe_fit"]["converged"], ope  # Pong has no ceiling reference here
    low, high = ope["returns_allowed"]
    for name in ("fqe", "wpdis", "dr"):  # random data logs its action probabilities
        estimate = ope["estimates"][name]
        if name == "wpdis" and estimate.get("status") == UNRELIABLE:  # a greedy policy collapses the weights
            assert estimate["effective_episodes"] < OPEConfig().min_effective_episodes, ope
        else:
            assert low <= estimate["value"] <= high, (name, ope)
        assert f"[ope bc] {name}: " in log
    assert "learns the dynamics of vector observations" in ope["estimates"]["model"]["undefined"]
    chosen = orl("select", "--dataset", "pong", cwd=workdir)  # by default by FQE and the model: here by FQE alone
    last = chosen.stderr.strip().splitlines()[-1]
    assert "ope/model" not in chosen.stderr and ("the highest lower bound by fqe;" in last or "(fqe of " in last), (
        chosen.stderr[-2000:])


def test_frames_go_to_minari_and_come_back_with_the_same_rows(workdir, tmp_path):
    assert_minari_round_trip(workdir, "pong", PONG, tmp_path)
