"""The policy: a locally built tokenizer and a Hugging Face causal LM, with the one log-prob definition.

See ``docs/policy.md`` for the token layout, the log-prob definition shared by the rollout
engine and the trainer, and the save/load format.
"""

from asyncrl.policy.model import Policy, PolicyLoadError, build_model, num_parameters, resolve_device
from asyncrl.policy.scoring import token_logprobs, token_logprobs_and_entropy
from asyncrl.policy.tokenizer import SPECIAL_TOKENS, build_tokenizer, special_id

__all__ = [
    "SPECIAL_TOKENS",
    "Policy",
    "PolicyLoadError",
    "build_model",
    "build_tokenizer",
    "num_parameters",
    "resolve_device",
    "special_id",
    "token_logprobs",
    "token_logprobs_and_entropy",
]
