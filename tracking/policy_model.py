"""The MLflow pyfunc form of a trained policy: a batch of observations in, a batch of greedy actions out.

Logged as MLflow "models from code": MLflow stores this file and runs it at load time, nothing is pickled.
"""

from __future__ import annotations

import mlflow.models
import mlflow.pyfunc
import numpy as np


class PolicyModel(mlflow.pyfunc.PythonModel):
    """Loads the RLModule saved by `orl train` with RLlib and acts greedily."""

    def load_context(self, context):
        from common.trained_policy import ModulePolicy, load_rl_module
        from dataset_format import space_from_dict

        module = load_rl_module(context.artifacts["module"])
        action_space = space_from_dict(context.model_config["action_space"])
        self.policy = ModulePolicy(module, action_space, greedy=True)

    def predict(self, context, model_input: np.ndarray, params=None) -> np.ndarray:
        obs = np.asarray(model_input)  # vectors as float32 rows, images as the env gives them
        actions, _ = self.policy.act(obs, rngs=[], envs=[])
        return actions


mlflow.models.set_model(PolicyModel())
