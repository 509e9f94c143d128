"""Rollout: the episode runner (``episode``), the rollout worker (``worker``), held-out evaluation
(``heldout``) and the evaluator role (``evaluator``); the engines are :mod:`asyncrl.engine`."""
