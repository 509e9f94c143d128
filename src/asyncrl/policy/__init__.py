"""The policy: a locally built tokenizer and a Hugging Face causal LM, with the one log-prob definition.

See ``docs/policy.md`` for the token layout, the log-prob definition shared by the rollout
engine and the trainer, and the save/load format.
"""

from asyncrl.policy.model import (
    Policy,
    PolicyLoadError,
    build_model,
    load_tensors,
    num_parameters,
    state_dict_tensors,
    token_logprobs,
    token_logprobs_and_entropy,
)
from asyncrl.policy.tokenizer import SPECIAL_TOKENS, build_tokenizer, special_id

__all__ = [
    "SPECIAL_TOKENS",
    "Policy",
    "PolicyLoadError",
    "build_model",
    "build_tokenizer",
    "load_tensors",
    "num_parameters",
    "special_id",
    "state_dict_tensors",
    "token_logprobs",
    "token_logprobs_and_entropy",
]
