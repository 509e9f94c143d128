"""``kb_lookup``: multi-hop questions over a fictional knowledge base, answered with ``lookup``.

The knowledge base is generated locally and deterministically from ``env.seed`` (all names
invented, so nothing can be answered from memorised world knowledge -- only through the tool).
Relations: :data:`RELATIONS`; an example is in docs/environments.md (``kb_lookup``).

Tool syntax: ``lookup(ENTITY, RELATION)`` -- the text before the LAST comma is the entity,
after it the relation (both whitespace-trimmed, entity names case-insensitive). The observation
is the related entity's name, or an ``error: ...`` line.
"""

from __future__ import annotations

import functools
import itertools
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from asyncrl.envs.base import HashSplitTaskSource, normalize, task_id
from asyncrl.envs.toolenv import ChainToolEnv, EnvOptionsError, refuse_unknown_options
from asyncrl.records import Task

if TYPE_CHECKING:
    from asyncrl.config import EnvConfig

__all__ = ["RELATIONS", "KBLookupEnv", "KBTasks", "KnowledgeBase", "kb_demonstrate", "kb_solve"]

RELATIONS: dict[str, str] = {
    "lives_in": "person -> city",
    "works_for": "person -> company",
    "friend": "person -> person",
    "based_in": "company -> city",
    "country": "city -> country",
    "currency": "country -> currency",
}

# (relation chain, question template); difficulty = number of hops = len(chain).
QUESTIONS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("lives_in",), "Which city does {x} live in?"),
    (("works_for",), "Which company does {x} work for?"),
    (("friend",), "Who is the friend of {x}?"),
    (("lives_in", "country"), "Which country does {x} live in?"),
    (("works_for", "based_in"), "In which city is the company of {x} based?"),
    (("friend", "lives_in"), "Which city does the friend of {x} live in?"),
    (("friend", "works_for"), "Which company does the friend of {x} work for?"),
    (("lives_in", "country", "currency"), "Which currency is used where {x} lives?"),
    (("works_for", "based_in", "country"), "In which country is the company of {x} based?"),
    (("friend", "lives_in", "country"), "Which country does the friend of {x} live in?"),
    (("friend", "works_for", "based_in"), "In which city is the company of the friend of {x} based?"),
)

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "tr")
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "n", "r", "l", "s", "m")


def _word(rng: random.Random, syllables: int) -> str:
    text = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))
    return text.capitalize()


@dataclass
class KnowledgeBase:
    """Facts as ``(entity, relation) -> entity``; generated from a seed, identical everywhere."""

    seed: int
    facts: dict[tuple[str, str], str]
    people: list[str]
    names: dict[str, str]
    """normalised name -> canonical name, for every entity."""

    @classmethod
    def generate(
        cls,
        seed: int,
        num_people: int = 200,
        num_cities: int = 24,
        num_countries: int = 8,
        num_companies: int = 16,
    ) -> KnowledgeBase:
        if min(num_people, num_cities, num_countries, num_companies) < 2:
            raise EnvOptionsError("kb_lookup: every entity count must be at least 2")
        rng = random.Random(f"kb-{seed}")
        used: set[str] = set()

        def fresh(make: Any) -> str:
            for _ in range(10_000):
                name = make()
                if normalize(name) not in used:
                    used.add(normalize(name))
                    return str(name)
            raise EnvOptionsError("kb_lookup: could not generate enough distinct names; use fewer entities")

        countries = [
            fresh(lambda: _word(rng, 2) + rng.choice(("land", "ia", "stan"))) for _ in range(num_countries)
        ]
        currencies = [fresh(lambda: _word(rng, 1).lower()) for _ in range(num_countries)]
        cities = [fresh(lambda: _word(rng, 2)) for _ in range(num_cities)]
        companies = [
            fresh(lambda: _word(rng, 2) + " " + rng.choice(("Co", "Inc", "Ltd")))
            for _ in range(num_companies)
        ]
        people = [fresh(lambda: _word(rng, 2) + " " + _word(rng, 2)) for _ in range(num_people)]
        facts = {(country, "currency"): cur for country, cur in zip(countries, currencies, strict=True)}
        facts |= {
            (c, "country"): countries[i] if i < num_countries else rng.choice(countries)
            for i, c in enumerate(cities)
        }
        facts |= {(company, "based_in"): rng.choice(cities) for company in companies}
        for i, person in enumerate(people):
            facts[(person, "lives_in")] = rng.choice(cities)
            facts[(person, "works_for")] = rng.choice(companies)
            facts[(person, "friend")] = rng.choice(people[:i] + people[i + 1 :])
        names = {normalize(n): n for n in [*countries, *currencies, *cities, *companies, *people]}
        return cls(seed=seed, facts=facts, people=people, names=names)

    def lookup(self, entity: str, relation: str) -> str | None:
        canonical = self.names.get(normalize(entity))
        return None if canonical is None else self.facts.get((canonical, relation))

    def follow(self, start: str, chain: tuple[str, ...] | list[str]) -> list[str]:
        """Entities visited along ``chain`` from ``start`` (one per hop)."""
        return list(itertools.accumulate(chain, lambda cur, rel: self.facts[(cur, rel)], initial=start))[1:]


get_kb = functools.cache(KnowledgeBase.generate)
"""Cached :meth:`KnowledgeBase.generate` (environments and task sources share one KB)."""


_SIZE_OPTIONS = ("num_people", "num_cities", "num_countries", "num_companies")


def _kb_options(options: dict[str, Any]) -> dict[str, int]:
    refuse_unknown_options("kb_lookup", options, _SIZE_OPTIONS)
    bad = [k for k, v in options.items() if not isinstance(v, int) or isinstance(v, bool) or v < 2]
    if bad:
        raise EnvOptionsError(f"env.options for 'kb_lookup': {bad} must be integers >= 2")
    return dict(options)


class KBTasks(HashSplitTaskSource):
    """Questions about one knowledge base; difficulty = hops. Split by (person, relation chain)."""

    task_types = ("multi_hop",)
    difficulties = (1, 2, 3)
    salt = "kb_lookup"

    def __init__(self, *, kb_options: dict[str, int] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kb_options = dict(kb_options or {})
        self.kb = get_kb(self.seed, **self.kb_options)

    def generate(self, rng: random.Random, difficulty: int) -> Task:
        chain, template = rng.choice([q for q in QUESTIONS if len(q[0]) == difficulty])
        person = rng.choice(self.kb.people)
        path = self.kb.follow(person, chain)
        key = f"{self.seed}|{person}|{'.'.join(chain)}"
        payload = {
            "prompt": template.format(x=person),
            "start": person,
            "chain": list(chain),
            "path": path,
            "answer": path[-1],
            "kb_seed": self.seed,
            "kb_options": self.kb_options,
        }
        return Task(id=task_id("kb", key), task_type="multi_hop", difficulty=difficulty, payload=payload)

    def content_key(self, task: Task) -> str:
        p = task.payload
        return f"{p['kb_seed']}|{p['start']}|{'.'.join(p['chain'])}"


def kb_solve(task: Task) -> list[str]:
    """One lookup per hop, each on the previous hop's result, then the answer."""
    cur = task.payload["start"]
    texts = []
    for rel, nxt in zip(task.payload["chain"], task.payload["path"], strict=True):
        texts.append(f"<tool>lookup({cur}, {rel})</tool>")
        cur = nxt
    return [*texts, f"<answer>{cur}</answer>"]


def kb_demonstrate(task: Task, rng: random.Random, corruption_rate: float) -> list[str]:
    """Reference episode, or with probability ``corruption_rate`` one mistake: a wrong
    relation in one lookup (wrong operand), a skipped last hop (answering the intermediate
    entity), or a wrong final copy (answering an earlier entity instead of the last result)."""
    if rng.random() >= corruption_rate:
        return kb_solve(task)
    p = task.payload
    kb = get_kb(int(p["kb_seed"]), **p.get("kb_options", {}))
    chain: list[str] = list(p["chain"])
    kind = rng.choice(("wrong_operand", "skipped_call", "wrong_final_copy"))
    if kind == "skipped_call":
        texts = kb_solve(task)[:-2]
        prev = p["path"][-2] if len(chain) > 1 else p["start"]
        return [*texts, f"<answer>{prev}</answer>"]
    if kind == "wrong_final_copy":
        texts = kb_solve(task)[:-1]
        visited = [p["start"], *p["path"][:-1]]
        return [*texts, f"<answer>{rng.choice(visited)}</answer>"]
    # wrong operand: one lookup uses a plausible but wrong relation of the same entity kind
    k = rng.randrange(len(chain))
    cur, texts = p["start"], []
    for i, rel in enumerate(chain):
        if i == k:
            alts = [r for r in ("lives_in", "works_for", "friend") if r != rel and (cur, r) in kb.facts]
            alts = alts or [r for r in RELATIONS if r != rel and (cur, r) in kb.facts]
            if alts:
                rel = rng.choice(alts)
        texts.append(f"<tool>lookup({cur}, {rel})</tool>")
        nxt = kb.facts.get((cur, rel))
        if nxt is None:
            break
        cur = nxt
    if texts == kb_solve(task)[:-1]:  # no alternative relation existed: fall back to a wrong copy
        return [*texts, f"<answer>{p['start']}</answer>"]
    return [*texts, f"<answer>{cur}</answer>"]


class KBLookupEnv(ChainToolEnv):
    """Multi-hop questions over a seeded fictional knowledge base; see the module docstring."""

    kind = "kb_lookup"
    tool_name, usage, chained = "lookup", "lookup(ENTITY, RELATION)", 0

    def __init__(self, seed: int, **kb_options: int) -> None:
        self.kb_options = _kb_options(kb_options)
        self.kb = get_kb(seed, **self.kb_options)
        super().__init__(
            "the related entity. Relations: " + ", ".join(RELATIONS),
            ("query", "ENTITY, RELATION (split at the last comma)"),
            f"{self.kb.people[0]}, lives_in",
            relations=dict(RELATIONS),
        )

    @classmethod
    def from_config(cls, cfg: EnvConfig) -> KBLookupEnv:
        return cls(seed=cfg.seed, **_kb_options(cfg.options))

    @classmethod
    def make_task_source(cls, cfg: EnvConfig) -> KBTasks:
        return KBTasks.from_config(cfg, kb_options=_kb_options(cfg.options))

    solve = staticmethod(kb_solve)
    demonstrate = staticmethod(kb_demonstrate)

    async def reset(self, task: Task) -> str:
        seed = task.payload.get("kb_seed")
        if seed is not None and seed != self.kb.seed:
            raise ValueError(
                f"task {task.id} was generated from knowledge base seed {seed}, this environment has seed "
                f"{self.kb.seed}; build both from the same env.seed"
            )
        return await super().reset(task)

    def call(self, entity: str, relation: str) -> tuple[bool, str]:
        if relation not in RELATIONS:
            return False, f"unknown relation {relation!r}; use one of {', '.join(RELATIONS)}"
        if normalize(entity) not in self.kb.names:
            return False, f"unknown entity {entity[:40]!r}"
        value = self.kb.lookup(entity, relation)
        if value is None:
            return False, f"{entity} has no {relation}"
        return True, value

    def same(self, text: str, value: str) -> bool:
        return normalize(text) == normalize(value)
