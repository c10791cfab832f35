"""Bad input through the real `orl` command: one line naming the problem, exit code 2, nothing overwritten."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from common.envs import env_spaces
from common.loopback_cluster import free_port
from dataset_format import space_to_dict
from tests.conftest import CORRIDOR, REPO, USER_CODE, assert_user_error, orl


@pytest.fixture
def workdir(tmp_path):
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    return tmp_path


def test_missing_dataset_path(workdir):
    result = orl("train", "--algo", "bc", "--dataset", "datasets/nope", cwd=workdir)
    assert_user_error(result, "datasets/nope does not exist")


def test_unknown_algorithm(workdir, expert_dataset):
    result = orl("train", "--algo", "ppo", "--dataset", str(expert_dataset), cwd=workdir)
    assert_user_error(result, "unknown algorithm 'ppo'", "bc, marwil")


def test_a_ray_address_where_no_cluster_answers(workdir):
    address = f"127.0.0.1:{free_port()}"
    for command in (["collect", "cartpole-expert"], ["repro"]):
        result = orl(*command, cwd=workdir, env={"RAY_ADDRESS": address})
        assert_user_error(result, f"RAY_ADDRESS={address}: no Ray cluster answers there", "ray start --head")
    assert not (workdir / "datasets").exists()


def test_unknown_dataset_name(workdir):
    assert_user_error(orl("collect", "cartpole-huge", cwd=workdir), "no dataset 'cartpole-huge'")


def test_unknown_env_id(workdir):
    params = yaml.safe_load((workdir / "params.yaml").read_text())
    params["datasets"]["cartpole-expert"]["env"] = "Pong-v5"
    (workdir / "params.yaml").write_text(yaml.safe_dump(params))
    assert_user_error(orl("collect", "cartpole-expert", cwd=workdir), "unknown env id 'Pong-v5'", "import: [ale_py]")


# Every bad spec's and controller's line is tested where it is made (tests/common/test_envs.py,
# tests/collectors/test_policies.py); here, that `orl` ends with it, exit 2 and nothing written.
@pytest.mark.parametrize("env,message", [
    ({"entry_point": "no_such_sim.envs:World"}, "env World: entry_point 'no_such_sim.envs:World' cannot be imported"),
    ({"id": "CartPole-v1", "entry_point": "a.b:C"}, "datasets.cartpole-expert.env: an env spec gives either `id`"),
])
def test_a_bad_env_spec_ends_collection_in_one_line(workdir, env, message):
    params = yaml.safe_load((workdir / "params.yaml").read_text())
    params["datasets"]["cartpole-expert"]["env"] = env
    (workdir / "params.yaml").write_text(yaml.safe_dump(params))
    assert_user_error(orl("collect", "cartpole-expert", cwd=workdir), message)
    assert not (workdir / "datasets").exists()


def test_a_bad_env_spec_ends_the_references_in_one_line(workdir):
    params = yaml.safe_load((workdir / "params.yaml").read_text())
    params["datasets"]["cartpole-expert"]["env"] = {"entry_point": "no_such_sim.envs:World"}
    (workdir / "params.yaml").write_text(yaml.safe_dump(params))
    assert_user_error(orl("reference", "--out", "references", cwd=workdir),
                      "env World: entry_point 'no_such_sim.envs:World' cannot be imported")


@pytest.mark.parametrize("env,controller,message", [
    ("CartPole-v1", "examples.controllers:pendulum",  # Pendulum's controller unpacks 3 numbers, CartPole gives 4
     "behaviour policy examples.controllers:pendulum raised ValueError: too many values to unpack"),
    (CORRIDOR.to_dict(), "corridor_sim.control:beyond_the_space",
     "behaviour policy corridor_sim.control:beyond_the_space returned 7, outside the action space Discrete(3)"),
])
def test_a_broken_controller_ends_collection_in_one_line_and_writes_nothing(workdir, env, controller, message):
    params = yaml.safe_load((workdir / "params.yaml").read_text())
    params["datasets"]["cartpole-expert"].update(env=env, policy={"kind": "callable", "callable": controller})
    (workdir / "params.yaml").write_text(yaml.safe_dump(params))
    result = orl("collect", "cartpole-expert", cwd=workdir, env={"PYTHONPATH": str(USER_CODE)})
    assert_user_error(result, message)
    assert not (workdir / "datasets").exists()


def test_evaluation_refuses_an_env_whose_spaces_are_not_the_trained_ones(workdir):
    """A run of CartPole data (run.json records its spaces) pointed at Acrobot: refused before any episode."""
    observation_space, action_space = (space_to_dict(space) for space in env_spaces("CartPole-v1"))
    run = workdir / "runs" / "bc-elsewhere"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({
        "env_id": "Acrobot-v1", "env_spec": {"id": "Acrobot-v1"}, "observation_space": observation_space,
        "action_space": action_space, "dataset": "cartpole-expert"}))
    assert_user_error(orl("evaluate", str(run), "--references", "references", cwd=workdir),
                      f"{run} was trained on the observation space Box(", "but env Acrobot-v1 has Box(")


def test_existing_run_is_not_overwritten(workdir, expert_dataset):
    run = workdir / "runs" / "bc"
    (run / "checkpoint").mkdir(parents=True)
    (run / "checkpoint" / "keep.txt").write_text("precious")
    result = orl("train", "--algo", "bc", "--dataset", str(expert_dataset), "--out", str(run), cwd=workdir)
    assert_user_error(result, "checkpoint already exists")
    assert (run / "checkpoint" / "keep.txt").read_text() == "precious"


def test_corrupt_dataset_is_refused_before_training(workdir, expert_dataset):
    broken = workdir / "broken"
    shutil.copytree(expert_dataset, broken)
    victim = sorted(broken.glob("*.parquet"))[0]
    victim.write_bytes(victim.read_bytes()[:-100])
    result = orl("train", "--algo", "bc", "--dataset", str(broken), cwd=workdir)
    assert_user_error(result, victim.name, "not a readable Parquet file")


def test_datasets_show_and_list(workdir, expert_dataset):
    shown = orl("datasets", "show", str(expert_dataset), cwd=workdir)
    assert shown.returncode == 0 and '"env_id": "CartPole-v1"' in shown.stdout
    listed = orl("datasets", "list", str(expert_dataset.parent), cwd=workdir)
    assert listed.returncode == 0 and "cartpole-expert" in listed.stdout and "10000 transitions" in listed.stdout


@pytest.mark.parametrize("model,message", [
    ("models:/CartPole-v1-nope@newest", "cannot load MLflow model 'models:/CartPole-v1-nope@newest'"),
    ("runs/missing/checkpoint", "runs/missing/checkpoint is not a checkpoint made by `orl train`"),
])
def test_a_behaviour_model_that_does_not_exist(workdir, model, message):
    params = yaml.safe_load((workdir / "params.yaml").read_text())
    params["datasets"]["from-model"] = {"env": "CartPole-v1", "episodes": 2, "seed": 0,
                                        "policy": {"kind": "model", "model": model}}
    (workdir / "params.yaml").write_text(yaml.safe_dump(params))
    result = orl("collect", "from-model", cwd=workdir, env={"MLFLOW_TRACKING_URI": f"sqlite:///{workdir}/m.db"})
    assert_user_error(result, message)
    assert not (workdir / "datasets" / "from-model").exists()


def test_datasets_validate(workdir, expert_dataset):
    good = orl("datasets", "validate", str(expert_dataset), cwd=workdir)
    assert good.returncode == 0 and "valid (20 episodes, 10000 transitions, 4 files)" in good.stdout
    broken = workdir / "broken"
    shutil.copytree(expert_dataset, broken)
    (broken / "_card.json").write_text("{not json")
    assert_user_error(orl("datasets", "validate", str(broken), cwd=workdir), "_card.json is corrupt")
