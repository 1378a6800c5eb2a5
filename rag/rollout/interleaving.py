"""Team-draft interleaving (Radlinski, Kurup & Joachims 2008): inside the canary share one list is shown, drafted
from production's and the candidate's rankings, and every shown passage remembers which team picked it, so a
click or rating on it is credited to that arm. Both arms are judged on the same query by the same user, which
needs far fewer queries than comparing two separate traffic splits.

Shared picks: when both teams' best passage not yet shown is the same passage, the list would be the same whichever
team took it; only the draft order decides whose it is. A click on it then says nothing about which ranking is
better, and crediting it (plain team draft) adds a coin flip to the query's outcome. A retrain agrees with the model
it started from on most top passages, so many decisive outcomes would be such coin flips (bench/canary_loop.py
reports both counts). A shared pick is shown and recorded like any other but credits nobody. The rule treats both
teams alike, so arms that are equally good still win and lose equally often, and identical rankings only ever tie."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

Team = Literal["a", "b"]
Outcome = Literal["a", "b", "tie"]
Signal = int | str  # +1 / -1 rating, or "click"


class Shown(NamedTuple):
    """One shown passage, the team whose ranking contributed it, and whether the other team would have shown it at
    that pick as well (shared: its signals credit nobody)."""

    doc_id: str
    team: Team
    shared: bool = False


class CoinSource(Protocol):
    def random(self) -> float: ...


def seed_from(*parts: str) -> int:
    """A 64-bit seed from strings (query text, session id...) via sha256: the same on every machine and run,
    unlike hash(), which Python salts per process."""
    digest = hashlib.sha256("\x1f".join(parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big")


def _coins(rng: CoinSource | int | str) -> CoinSource:
    if isinstance(rng, str):
        return random.Random(seed_from(rng))
    if isinstance(rng, int):
        return random.Random(rng)
    if hasattr(rng, "random"):
        return rng  # random.Random, numpy Generator, or a scripted source in tests
    raise TypeError(
        "rng must be a seed (int), a string to derive one from (query or session id), or an object "
        "with a random() method such as random.Random or numpy.random.Generator"
    )


def team_draft_interleave(
    ranking_a: Sequence[str], ranking_b: Sequence[str], k: int, rng: CoinSource | int | str
) -> list[Shown]:
    """Up to `k` passages drafted from two rankings, each tagged with the team that picked it.

    Each pick goes to the team with fewer picks so far; when both have as many (the start of every round) a coin
    decides, team "a" on rng.random() < 0.5. The picking team takes its highest-ranked doc not already shown, so a
    doc both rankings hold goes to whichever picks it first; it is `shared` when it was the other team's next doc
    too. When one ranking has nothing new left the other keeps
    picking; drafting stops at `k` docs or when both are exhausted. Deterministic for a given seed: pass the
    session or query id (a string) to make what the API showed reproducible."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    coins = _coins(rng)
    shown: list[Shown] = []
    taken: set[str] = set()
    picks = {"a": 0, "b": 0}
    cursor = {"a": 0, "b": 0}
    rankings = {"a": list(ranking_a), "b": list(ranking_b)}

    def next_new(team: str) -> str | None:
        ranking = rankings[team]
        while cursor[team] < len(ranking) and ranking[cursor[team]] in taken:
            cursor[team] += 1
        return ranking[cursor[team]] if cursor[team] < len(ranking) else None

    while len(shown) < k:
        new = {"a": next_new("a"), "b": next_new("b")}
        if new["a"] is None and new["b"] is None:
            break
        if new["a"] is None or new["b"] is None:
            team = "b" if new["a"] is None else "a"
        elif picks["a"] != picks["b"]:
            team = "a" if picks["a"] < picks["b"] else "b"
        else:
            team = "a" if coins.random() < 0.5 else "b"
        doc = new[team]
        shown.append(Shown(doc, team, new["a"] == new["b"]))
        taken.add(doc)
        picks[team] += 1
    return shown


@dataclass(frozen=True)
class QueryCredit:
    """Credit of one interleaved query: each team's score and who won."""

    a: int
    b: int

    @property
    def outcome(self) -> Outcome:
        return "a" if self.a > self.b else "b" if self.b > self.a else "tie"


def signal_value(signal: Signal) -> int:
    """ "click" and +1 count +1 for the team; -1 and 0 count nothing (see credit)."""
    if signal == "click":
        return 1
    if isinstance(signal, bool) or not isinstance(signal, int) or signal not in (-1, 0, 1):
        raise ValueError(f"unknown signal {signal!r}: use +1 or -1 (passage rating), 0 (none) or 'click'")
    return max(signal, 0)


def credit(
    shown: Iterable[Shown | tuple], signals: Mapping[str, Signal], *, clicks_beside_a_like: bool = False
) -> QueryCredit:
    """Credits each signal to the team that contributed the passage.

    A team's score = its passages clicked or rated +1; the team with the higher score wins the query, equal scores
    (no signals at all included) are a tie. One signal per passage: when a passage was clicked and rated, pass the
    rating, which says more than the click (a click then rated -1 credits nobody). Where the person rated a passage
    +1, their clicks on passages they did not rate credit nobody: the +1 says which passage answered, the clicks
    beside it are reading on the way to it. Counted (`clicks_beside_a_like`, the rule before, kept for reports), a
    click on production's passage cancelled a like of the candidate's: replayed on the first reranker canaries of
    two TAT-QA loop runs, leaving them out moved the log-likelihood ratio from -0.41 to +0.59 and from -0.58 to
    +1.01 (bench/results/canary-credit-ratings.json). A -1 debits nobody: people rate down the passages they read
    that were not the answer, so -1s follow which team's passages were read more than which ranking found the
    answer, and team draft credits what was chosen. On TAT-QA a reranker +0.053 MRR@10 on the test split stood at 43
    wins to 41 with -1s counted; on clicks and +1s it won 29 questions to production's 16, on -1s alone it lost 24
    to 31 (bench/results/canary-credit.json, where other runs are less one-sided). Signals on passages that were not
    shown, or that were shared picks (both teams would have shown them there), are ignored: they tell the two
    rankings apart no more than a coin would. `shown`: Shown records or (doc, team[, shared]) tuples."""
    team_of = {}
    for doc, team, *rest in shown:
        team_of[doc] = None if rest and rest[0] else team
    score = {"a": 0, "b": 0}
    liked = not clicks_beside_a_like and any(signal_value(v) > 0 and v != "click" for v in signals.values())
    for doc, signal in signals.items():
        value = 0 if liked and signal == "click" else signal_value(signal)
        if team_of.get(doc) is not None:
            score[team_of[doc]] += value
    return QueryCredit(score["a"], score["b"])


def tally(outcomes: Iterable[Outcome], candidate: Team = "b") -> tuple[int, int, int]:
    """Per-query outcomes → (candidate wins, candidate losses, ties)."""
    if candidate not in ("a", "b"):
        raise ValueError(f"candidate must be team 'a' or 'b', got {candidate!r}")
    counts = {"a": 0, "b": 0, "tie": 0}
    for outcome in outcomes:
        if outcome not in counts:
            raise ValueError(f"unknown outcome {outcome!r}: use 'a', 'b' or 'tie'")
        counts[outcome] += 1
    other = "a" if candidate == "b" else "b"
    return counts[candidate], counts[other], counts["tie"]
