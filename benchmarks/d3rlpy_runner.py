"""Trains one d3rlpy algorithm on one of our Parquet datasets and evaluates it; prints one JSON line.

Runs in its own virtualenv (d3rlpy pins another gymnasium than ray[rllib]; see benchmarks/quality.md), so it
imports nothing from this project but common/envs.py (gymnasium alone), to make the environment as every stage
does from the spec the card records: the dataset is read with pyarrow alone, by the column names the dataset
card lists. The JSON holds the evaluation's returns and d3rlpy's own metrics (its loss terms, CQL's learned weight
`alpha`), the means of each epoch of `--epoch-updates` updates.

Settings of the runner's own (`PROBES`), passed in `--config` beside d3rlpy's fields, change how d3rlpy's continuous
CQL trains to what ours does, one respect each, to find where the two part (benchmarks/mujoco.md, "Level with d3rlpy's
CQL"). At `rllib`:
- `update_order` computes the policy's loss from the critics before their step (d3rlpy steps its critics, then
  computes it), as RLlib's learner takes every loss before any step;
- `adam_eps` gives every optimizer RLlib's SAC's epsilon, 1e-7 (d3rlpy's: 1e-8);
- `log_std_bounds` clamps the policy's log-deviations to RLlib's [-5, 2] (d3rlpy's: [-20, 2]);
- `temperature_loss` learns the entropy temperature's log t from RLlib's loss, -log t (log p - A), whose gradient is
  d3rlpy's, -t (log p - A), over t.
`batch_draws: shuffled_passes` draws each batch from a fresh permutation of the transitions, pass after pass, as ours
does, where d3rlpy draws every one with replacement. `initial_weights: FILE` starts from the weights of one of our
CQLs, as `benchmarks/cql_one_update.py --save-weights FILE` writes them. `--save-initial-weights FILE` writes d3rlpy's
own, which quality_table.py's `--initial-weights` starts ours from; `--save-weights FILE` those it trained, which
`benchmarks/critic_probe.py --d3rlpy-weights` reads.

    .venv-d3rlpy/bin/python benchmarks/d3rlpy_runner.py --dataset datasets/cartpole-medium --algo cql \
        --seed 0 --steps 2000 --epoch-updates 1000 --batch-size 256 --lr 1e-3 --hidden 256 256 --gamma 0.99 \
        --target-update-every 100 --cql-alpha 1.0 --eval-seeds '[1, 2, 3]'
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
from pathlib import Path

import d3rlpy
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch


def load(dataset_dir: Path):
    """(card, whether actions are discrete, the transitions as a d3rlpy MDPDataset).

    Stacked frames (observations of 3 axes, the stack first, as FrameStackObservation makes them) are loaded as
    d3rlpy's Atari datasets hold them: each transition's newest frame alone, stacked again when d3rlpy samples
    (its FrameStack picker and slicer, which pad an episode's first stacks with blank frames where ours repeat the
    first frame). A million 4-frame stacks would otherwise take 28 GB."""
    card = json.loads((dataset_dir / "_card.json").read_text())
    discrete = card["action_space"]["type"] == "Discrete"
    frames = image_stack(card)
    files = [dataset_dir / f["path"] for f in card["files"]]
    table = pa.concat_tables(pq.read_table(path, columns=None if frames is None else NOT_OBSERVATIONS)
                             for path in files)

    actions = numpy_column(table, "actions")
    actions = actions.astype(np.int64) if discrete else actions.reshape(len(actions), -1)
    stacking = {}
    if frames is None:
        observations = numpy_column(table, "obs")
    else:
        observations = newest_frames(files, frames)
        stacking = dict(transition_picker=d3rlpy.dataset.FrameStackTransitionPicker(n_frames=frames[0]),
                        trajectory_slicer=d3rlpy.dataset.FrameStackTrajectorySlicer(n_frames=frames[0]))
    # d3rlpy splits episodes at terminal or timeout flags, and refuses a step flagged both, which Gymnasium allows (a
    # hopper falling at the time limit's step): that step ends by termination, with no value beyond it.
    terminals = numpy_column(table, "terminateds")
    return card, discrete, d3rlpy.dataset.MDPDataset(
        observations=observations, actions=actions, rewards=numpy_column(table, "rewards"),
        terminals=terminals, timeouts=numpy_column(table, "truncateds") * (1 - terminals),
        action_space=d3rlpy.ActionSpace.DISCRETE if discrete else d3rlpy.ActionSpace.CONTINUOUS, **stacking,
    )


def numpy_column(table: pa.Table, name: str) -> np.ndarray:
    """A column of the dataset's rows as float32, a fixed-size list column as a 2-D array."""
    values = table.column(name).combine_chunks()
    if pa.types.is_fixed_size_list(values.type):
        return values.flatten().to_numpy().reshape(len(values), values.type.list_size).astype(np.float32)
    return values.to_numpy(zero_copy_only=False).astype(np.float32)


NOT_OBSERVATIONS = ["actions", "rewards", "terminateds", "truncateds"]
# The runner's own settings (see the module's docstring), by name, with their values; each one's first is d3rlpy's.
# `initial_weights` takes a file's path instead of its second.
PROBES = {"update_order": ("d3rlpy", "rllib"), "batch_draws": ("with_replacement", "shuffled_passes"),
          "adam_eps": ("d3rlpy", "rllib"), "log_std_bounds": ("d3rlpy", "rllib"),
          "temperature_loss": ("d3rlpy", "rllib"), "initial_weights": ("d3rlpy",)}
# RLlib 2.60's SAC learner's Adam epsilon, and the bounds of its squashed Gaussian's log-deviations
# (MIN_LOG_NN_OUTPUT, MAX_LOG_NN_OUTPUT).
RLLIB_ADAM_EPS = 1e-7
RLLIB_LOG_STD_BOUNDS = (-5.0, 2.0)


def image_stack(card: dict) -> tuple[int, int, int] | None:
    """The (stack, height, width) of stacked uint8 frames, or None for vectors."""
    space = card["observation_space"]
    if space["type"] != "Box" or len(space["shape"]) != 3:
        return None
    if space["dtype"] != "uint8" or space["shape"][0] >= space["shape"][-1]:  # as common/observations.py tells
        raise SystemExit(f"d3rlpy_runner.py reads uint8 frames stacked on the first axis (FrameStackObservation); "
                         f"{card['name']}'s are {space['dtype']} of shape {space['shape']}")
    return tuple(space["shape"])


def image_rows(column: pa.Array) -> np.ndarray:
    """A column of images as uint8 values, stored as dictionary-encoded frames (schema version 3), one binary value
    each (version 2) or as lists (version 1); dataset_format's `column_to_numpy`, which this virtualenv cannot
    import."""
    if pa.types.is_fixed_size_list(column.type) and pa.types.is_dictionary(column.type.value_type):
        frames = column.flatten()
        return np.frombuffer(b"".join(frames.dictionary.to_pylist()), np.uint8).reshape(
            len(frames.dictionary), -1)[frames.indices.to_numpy()]
    if pa.types.is_fixed_size_binary(column.type):
        width = column.type.byte_width
        return np.frombuffer(column.buffers()[1], np.uint8, len(column) * width, column.offset * width)
    return column.flatten().to_numpy()


def newest_frames(files: list[Path], stack: tuple[int, int, int]) -> np.ndarray:
    """(transitions, 1, height, width) uint8: the last frame of each stack, read a row group at a time."""
    parts = []
    for path in files:
        parquet = pq.ParquetFile(path)
        for group in range(parquet.num_row_groups):  # a batch across groups of frames is a read pyarrow refuses
            rows = parquet.read_row_group(group, columns=["obs"]).column(0).combine_chunks()
            parts.append(image_rows(rows).reshape(len(rows), *stack)[:, -1:].copy())
    return np.concatenate(parts)


def make_env(card: dict):
    """The environment the card records (its `env_spec`; cards written before specs existed name an id alone)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # common/envs.py, without installing the project
    from common.envs import EnvSpec
    from common.envs import make_env as make

    spec = EnvSpec.recorded(card["env_id"], card.get("env_spec"))
    if spec is None:
        raise SystemExit(f"dataset {card['name']} has no simulator to evaluate on")
    return make(spec)


def build(args, card: dict, discrete: bool):
    common = dict(batch_size=args.batch_size, gamma=args.gamma)
    if image_stack(card) is None:
        encoder = d3rlpy.models.VectorEncoderFactory(hidden_units=args.hidden)
    else:
        # Our CNN then hidden layers; d3rlpy's pixel encoder has one dense layer after its convolutions.
        if len(args.hidden) != 1:
            raise SystemExit(f"d3rlpy's pixel encoder has one dense layer after the CNN; --hidden {args.hidden} "
                             "has more")
        encoder = d3rlpy.models.PixelEncoderFactory(filters=args.conv_filters, feature_size=args.hidden[0])
        common["observation_scaler"] = d3rlpy.preprocessing.PixelObservationScaler()  # /255, as ours
    if not discrete:
        # d3rlpy's continuous policies act in [-1, 1] (tanh); without a scaler Pendulum's torque is held to half its
        # range. The env's bounds, as our tanh policies are rescaled to them.
        common["action_scaler"] = d3rlpy.preprocessing.MinMaxActionScaler(
            minimum=np.asarray(card["action_space"]["low"], dtype=np.float32),
            maximum=np.asarray(card["action_space"]["high"], dtype=np.float32))
    if discrete and args.algo == "bc":
        return d3rlpy.algos.DiscreteBCConfig(learning_rate=args.lr, encoder_factory=encoder, batch_size=args.batch_size,
                                             observation_scaler=common.get("observation_scaler"))
    if discrete and args.algo == "cql":
        return d3rlpy.algos.DiscreteCQLConfig(learning_rate=args.lr, encoder_factory=encoder, alpha=args.cql_alpha,
                                              target_update_interval=args.target_update_every, **common)
    if not discrete and args.algo == "bc":
        return d3rlpy.algos.BCConfig(learning_rate=args.lr, encoder_factory=encoder, batch_size=args.batch_size,
                                     action_scaler=common["action_scaler"])
    if not discrete and args.algo == "cql":
        return d3rlpy.algos.CQLConfig(actor_learning_rate=args.actor_lr, critic_learning_rate=args.lr,
                                      actor_encoder_factory=encoder, critic_encoder_factory=encoder,
                                      conservative_weight=args.cql_alpha, tau=args.tau, **common)
    if not discrete and args.algo == "iql":
        return d3rlpy.algos.IQLConfig(actor_learning_rate=args.actor_lr, critic_learning_rate=args.lr,
                                      actor_encoder_factory=encoder, critic_encoder_factory=encoder,
                                      value_encoder_factory=encoder, expectile=args.expectile,
                                      weight_temp=args.beta, tau=args.tau, **common)
    raise SystemExit(f"unknown algo {args.algo} for {'discrete' if discrete else 'continuous'} actions")


def rllib_order_update(impl, batch, grad_step: int) -> dict[str, float]:
    """d3rlpy's continuous CQL update (DDPGBaseImpl.inner_update) with the policy's loss taken from the critics before
    their step, then the critics' step, then the policy's, as RLlib's learner orders them. The critics' loss reads the
    policy's outputs detached, so its backward leaves the policy's gradients as the policy's loss made them."""
    modules = impl.modules
    modules.actor_optim.zero_grad()
    actor = impl.compute_actor_loss(batch, modules.policy(batch.observations))  # steps the temperature first
    actor.actor_loss.backward()
    metrics = impl.update_critic(batch)  # clears the critics' gradients of the policy's loss before its own
    modules.actor_optim.step()
    impl.update_critic_target()
    return {**metrics, **d3rlpy.dataclass_utils.asdict_as_float(actor)}


def update_in_rllib_order(algo) -> None:
    """Makes a built continuous CQL update as `rllib_order_update` does."""
    algo.impl.inner_update = types.MethodType(rllib_order_update, algo.impl)


def temperature_step_on_log(impl, log_prob: torch.Tensor) -> torch.Tensor:
    """d3rlpy's `update_temp` with RLlib's loss of the temperature's log, -log t (log p - A)."""
    modules = impl.modules
    modules.temp_optim.zero_grad()
    log_temperature = d3rlpy.models.torch.get_parameter(modules.log_temp)
    loss = -(log_temperature * (log_prob.detach() - impl.action_size)).mean()
    loss.backward()
    modules.temp_optim.step()
    return loss


def clamp_log_std(policy, inputs, output):
    """A forward hook on d3rlpy's policy: its log-deviations within RLlib's bounds."""
    return type(output)(output.mu, output.squashed_mu, output.logstd.clamp(*RLLIB_LOG_STD_BOUNDS))


def network_parameters(modules) -> dict:
    """A built continuous CQL's parameters of its networks (policy, critics, target critics), by d3rlpy's names."""
    return {name: p for part in ("policy", "q_funcs", "targ_q_funcs")
            for name, p in getattr(modules, part).named_parameters(prefix=part)}


def copy_weights(modules, saved: dict) -> None:
    """Sets a built continuous CQL's networks, its temperature and its conservative weight to `saved`'s: our CQL's, by
    d3rlpy's names, as `benchmarks/cql_one_update.py` maps them."""
    parameters = network_parameters(modules)
    if set(parameters) != set(saved["weights"]):
        raise SystemExit(f"the weights do not map onto d3rlpy's networks: "
                         f"{sorted(set(parameters) ^ set(saved['weights']))}")
    get_parameter = d3rlpy.models.torch.get_parameter
    with torch.no_grad():
        for name, tensor in saved["weights"].items():
            parameters[name].copy_(tensor)
        get_parameter(modules.log_temp).fill_(saved["log_temperature"])
        get_parameter(modules.log_alpha).fill_(saved["log_conservative_weight"])


def saved_weights(modules) -> dict:
    """`copy_weights`' inverse: a built continuous CQL's networks, temperature and conservative weight, as
    `benchmarks/cql_one_update.py --save-weights` writes ours."""
    get_parameter = d3rlpy.models.torch.get_parameter
    return {"weights": {name: p.detach().clone() for name, p in network_parameters(modules).items()},
            "log_temperature": get_parameter(modules.log_temp).item(),
            "log_conservative_weight": get_parameter(modules.log_alpha).item()}


def draw_in_shuffled_passes(data, seed: int):
    """`data.sample_transition` (which d3rlpy's batches call once a row) drawing from a fresh permutation of the
    transitions at each pass, instead of a uniform draw with replacement."""
    rng, order = np.random.default_rng(seed), []

    def sample_transition():
        if not order:
            order.extend(rng.permutation(data.transition_count).tolist())
        episode, index = data.buffer[order.pop()]
        return data.transition_picker(episode, index)

    return sample_transition


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--algo", choices=["bc", "cql", "iql"], required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True, help="gradient updates")
    parser.add_argument("--epoch-updates", type=int, required=True,
                        help="updates an epoch, of which d3rlpy reports its metrics' means (a divisor of --steps)")
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--lr", type=float, required=True,
                        help="learning rate (the critics', for continuous CQL and IQL)")
    parser.add_argument("--actor-lr", type=float, default=1e-4)
    parser.add_argument("--hidden", type=int, nargs="+", required=True)
    parser.add_argument("--conv-filters", type=json.loads, default=[[32, 8, 4], [64, 4, 2], [64, 3, 1]],
                        help="JSON [[channels, kernel, stride], ...]: the CNN for image observations")
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--tau", type=float, default=0.005)
    parser.add_argument("--target-update-every", type=int, default=100)
    parser.add_argument("--cql-alpha", type=float, default=1.0)
    parser.add_argument("--expectile", type=float, default=0.7)
    parser.add_argument("--beta", type=float, default=3.0, help="IQL's inverse temperature (d3rlpy's weight_temp)")
    parser.add_argument("--eval-seeds", type=json.loads, required=True, help="JSON list of env reset seeds")
    parser.add_argument("--config", type=json.loads, default={},
                        help="JSON {field: value} of the d3rlpy config's own fields, over its defaults (e.g. "
                             "'{\"alpha_learning_rate\": 0}' holds CQL's conservative weight fixed)")
    parser.add_argument("--save-initial-weights", type=Path, metavar="FILE",
                        help="continuous CQL: write the weights it starts from (by d3rlpy's names, as "
                             "cql_one_update.py --save-weights writes ours) and train nothing")
    parser.add_argument("--save-weights", type=Path, metavar="FILE",
                        help="continuous CQL: write the weights it trained, as --save-initial-weights does")
    args = parser.parse_args()
    if args.steps % args.epoch_updates:
        raise SystemExit(f"--epoch-updates {args.epoch_updates} does not divide --steps {args.steps}")

    probes = {name: args.config.pop(name, values[0]) for name, values in PROBES.items()}
    for name, value in probes.items():
        if name == "initial_weights" and value != PROBES[name][0] and not Path(value).is_file():
            raise SystemExit(f"--config: initial_weights is d3rlpy or a file of weights; {value} is no file")
        if name != "initial_weights" and value not in PROBES[name]:
            raise SystemExit(f"--config: {name} is one of {', '.join(PROBES[name])}, not {value}")
    card, discrete, data = load(args.dataset)
    d3rlpy.seed(args.seed)
    config = build(args, card, discrete)
    unknown = set(args.config) - {field.name for field in dataclasses.fields(config)}
    if unknown:
        raise SystemExit(f"--config: {type(config).__name__} has no field {', '.join(sorted(unknown))}")
    like_ours = [name for name, value in probes.items() if name != "batch_draws" and value != PROBES[name][0]]
    if like_ours and not isinstance(config, d3rlpy.algos.CQLConfig):
        raise SystemExit(f"--config: {', '.join(like_ours)} applies to continuous CQL, not {type(config).__name__}")
    for option, given in (("--save-initial-weights", args.save_initial_weights), ("--save-weights", args.save_weights)):
        if given and not isinstance(config, d3rlpy.algos.CQLConfig):
            raise SystemExit(f"{option} applies to continuous CQL, not {type(config).__name__}")
    if probes["adam_eps"] == "rllib":
        args.config |= {f"{part}_optim_factory": d3rlpy.optimizers.AdamFactory(eps=RLLIB_ADAM_EPS)
                        for part in ("actor", "critic", "temp", "alpha")}
    algo = dataclasses.replace(config, **args.config).create(device="cpu:0")
    algo.build_with_dataset(data)
    if probes["update_order"] == "rllib":
        update_in_rllib_order(algo)
    if probes["log_std_bounds"] == "rllib":
        algo.impl.modules.policy.register_forward_hook(clamp_log_std)
    if probes["temperature_loss"] == "rllib":
        algo.impl.update_temp = types.MethodType(temperature_step_on_log, algo.impl)
    if probes["initial_weights"] != "d3rlpy":
        copy_weights(algo.impl.modules, torch.load(probes["initial_weights"]))
    if args.save_initial_weights:
        torch.save(saved_weights(algo.impl.modules), args.save_initial_weights)
        return
    if probes["batch_draws"] == "shuffled_passes":
        data.sample_transition = draw_in_shuffled_passes(data, args.seed)
    # Epochs only group the updates for reporting: the batches and the updates are the same for any epoch length.
    epochs = algo.fit(data, n_steps=args.steps, n_steps_per_epoch=args.epoch_updates, show_progress=False,
                      save_interval=10**9, experiment_name=None, with_timestamp=False,
                      logger_adapter=d3rlpy.logging.NoopAdapterFactory())
    if args.save_weights:
        torch.save(saved_weights(algo.impl.modules), args.save_weights)

    env = make_env(card)
    returns = []
    for env_seed in args.eval_seeds:  # greedy policy, one episode per seed: the seeds our evaluation uses
        obs, _ = env.reset(seed=env_seed)
        done, total = False, 0.0
        while not done:
            action = algo.predict(np.asarray(obs, dtype=np.float32)[None])[0]
            obs, reward, terminated, truncated, _ = env.step(action)
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    print(json.dumps({"returns": returns, "metrics": [{"epoch": epoch, **metrics} for epoch, metrics in epochs]}))


if __name__ == "__main__":
    main()
