"""A counter environment written for TRL's ``GRPOTrainer(environment_factory=CounterEnv)``.

Nothing here imports asyncrl: the same class trains in TRL and, unchanged, in asyncrl
(``env.kind: class``, configs/trl_class.yaml). ``reset(**row)`` receives every column of a row
of rows.jsonl; the public methods are the tools; ``reward_func`` scores each episode from its
environment's state.
"""

from __future__ import annotations


class CounterEnv:
    def __init__(self) -> None:
        self.value = 0
        self.target = 0

    def reset(self, **kwargs) -> str:  # type: ignore[no-untyped-def]
        self.value = int(kwargs["start"])
        self.target = int(kwargs["target"])
        return f" The counter shows {self.value}."

    def add(self, amount: int, times: int = 1) -> int:
        """
        Add an amount to the counter, one or more times.

        Args:
            amount: The number to add (negative to subtract), between -50 and 50.
            times: How many times to add it.

        Returns:
            The counter's new value.
        """
        if not -50 <= amount <= 50:
            raise ValueError("amount must be between -50 and 50")
        self.value += amount * times
        return self.value

    def read(self) -> int:
        """
        Read the counter.

        Returns:
            The counter's value.
        """
        return self.value


def reward_func(environments, **kwargs) -> list[float]:  # type: ignore[no-untyped-def]
    """1.0 for an episode that left the counter on its target, else 0.0."""
    return [1.0 if env.value == env.target else 0.0 for env in environments]
