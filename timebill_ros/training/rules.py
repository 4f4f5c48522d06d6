"""RT-LM's six linguistic-uncertainty rule scores (Table I), from regexes and word lists.

RT-LM (Sec. III-B, "Single rule") tags each word with spaCy part-of-speech tags and then
searches each uncertainty's patterns with regular expressions; the vague-expression rule
(Listing 1) counts the occurrences of a vague-word list and multiplies the count by a weight.
spaCy and its trained pipelines cannot be installed here (the machines are offline), so every
rule below is written with plain regular expressions over the lower-cased text and short word
lists of our own instead of POS tags. Each score is ``weight * count`` of what the rule finds;
it is 0.0 when the rule finds nothing. The lists are small and tuned on Table I's examples and
on the corpus templates (``training.corpus``), so this is an approximation of RT-LM's rules, not
a reimplementation of them.
"""

import re
from typing import Dict, Optional

import numpy as np

RULE_NAMES = ('structural', 'syntactic', 'semantic', 'vague', 'open_ended', 'multi_part')
DEFAULT_WEIGHTS = {name: 1.0 for name in RULE_NAMES}

_DET = r"(?:the|a|an|this|that|these|those|his|her|their|my|your|our|its|some)"
_PREP = r"(?:with|near|on|in|over|under|behind|beside|by|at|from|without|using|through)"
# Structural: a noun phrase followed by a prepositional phrase ("a boy in the park", "the park
# with a telescope"): the PP may attach to the noun or to the verb. Counted with a lookahead,
# so chained PPs count once each.
_PP_ATTACH = re.compile(rf"(?=\b{_DET}\s+(?:[a-z'-]+\s+){{0,2}}?[a-z'-]+\s+{_PREP}\s+"
                        rf"(?:{_DET}\s+)?[a-z'-]+)")
# ... and a noun modified by "of" then a relative clause ("the son of the man who ...").
_REL_ATTACH = re.compile(rf"\bof\s+{_DET}\s+[a-z'-]+\s+(?:who|that|which)\b")

# Syntactic: words that are common both as a noun and as a verb (or adjective and verb);
# without a tagger each occurrence counts as one possible mis-tagging.
_POS_AMBIGUOUS = frozenset("""
flies fly like man saw duck ducks watch watches lifts drops drop rose left lead leads
plants plant park parks ship ships book books fire fires train trains object objects
present record records permit permits row rows tear tears wind wound bear bears fish
fishes complex refuse waste leaves face faces runs point points
""".split())
# "<-ing word> <plural> can/are ..." ("Flying planes can be dangerous", "Visiting engineers
# can be tiring"): gerund or adjective.
_GERUND_SUBJECT = re.compile(
    r"(?:^|[.;!?]\s*)[a-z]+ing\s+[a-z]+s\s+(?:can|could|may|might|are|were|is|was)\b")

# Semantic: words with several common, unrelated meanings.
_POLYSEMOUS = frozenset("""
bank bat trunk monitor mouse pitch charge bug bass bark crane seal spring match fan current
date file key mole nail organ palm pen pool ring scale sink star tie wave bow club port mine
draft jam pupil racket ruler yard chip mercury java python apple jaguar bolt boot cabinet
""".split())
_WORD = re.compile(r"[a-z][a-z'-]*")

# Vague expressions: phrases asking for everything about a broad topic, broad concept nouns,
# and hedges (Listing 1 counts such words in the lemmatised text).
_VAGUE_PHRASES = (
    'tell me about', 'talk about', 'something about', 'anything about', 'what do you know',
    'in general', 'kind of', 'sort of', 'a lot', 'and so on', 'and stuff', 'overview of',
    'everything about', 'more or less')
_VAGUE_WORDS = frozenset("""
things stuff everything anything something various several many some somewhat generally
aspects topics history science technology art arts culture society life world nature
philosophy universe people overall broadly basically etc
""".split())

# Open-endedness: question stems without a single definitive answer.
_OPEN_STEMS = (
    'why', 'how will', 'how would', 'how should', 'how could', 'how might', 'how can we',
    'what makes', 'what if', 'what would', 'causes and consequences', 'future of',
    'impact of', 'effects of', 'pros and cons', 'advantages and disadvantages',
    'what do you think', 'your opinion', 'should we', 'should society', 'role of',
    'implications', 'is it ethical', 'is it possible', 'best way', 'discuss', 'debate',
    'imagine', 'in your view')

# Multi-partness: extra question marks, new question clauses after a comma, enumerations,
# comparisons and ordinal markers.
_CLAUSE_QUESTION = re.compile(
    r"[,;:]\s*(?:and\s+|or\s+|then\s+)?(?:what|how|why|where|when|who|which|whose)\b")
_COMPARE = re.compile(r"\b(?:compare|comparing|differ|differs|difference|differences|versus|"
                      r"vs\.?|both|respectively|between|contrast)\b")
_ORDINAL = re.compile(r"\b(?:first(?:ly)?|second(?:ly)?|third(?:ly)?|finally|also)\b|"
                      r"(?m:^\s*(?:\d+[.)]|[-*\u2022])\s)")
_CONJ = re.compile(r"\b(?:and|or)\b")


def _normalise(text: str) -> str:
    if not isinstance(text, str):
        raise TypeError(f'text must be a str, got {type(text).__name__}')
    return text.lower().replace('\u2019', "'").replace('\u2018', "'")


def _phrase_count(text: str, phrases) -> int:
    return sum(len(re.findall(rf"\b{re.escape(p)}\b", text)) for p in phrases)


def _word_count(text: str, words) -> int:
    """Count words of ``text`` in ``words``, also as plurals (-s / -es): a crude lemmatiser."""
    n = 0
    for w in _WORD.findall(text):
        w = w.removesuffix("'s")
        if w in words or (w.endswith('s') and (w[:-1] in words or
                                               (w.endswith('es') and w[:-2] in words))):
            n += 1
    return n


def structural_count(text: str) -> int:
    """Count possible prepositional-phrase and relative-clause attachment sites."""
    t = _normalise(text)
    return len(_PP_ATTACH.findall(t)) + len(_REL_ATTACH.findall(t))


def syntactic_count(text: str) -> int:
    """Count noun/verb-ambiguous words and gerund-or-adjective subjects."""
    t = _normalise(text)
    n_words = sum(1 for w in _WORD.findall(t) if w in _POS_AMBIGUOUS)
    return n_words + len(_GERUND_SUBJECT.findall(t))


def semantic_count(text: str) -> int:
    """Count polysemous words (singular or plural)."""
    return _word_count(_normalise(text), _POLYSEMOUS)


def vague_count(text: str) -> int:
    """Count vague phrases and broad or hedging words."""
    t = _normalise(text)
    return _phrase_count(t, _VAGUE_PHRASES) + _word_count(t, _VAGUE_WORDS)


def open_ended_count(text: str) -> int:
    """Count open-ended question stems."""
    return _phrase_count(_normalise(text), _OPEN_STEMS)


def multi_part_count(text: str) -> int:
    """Count the parts beyond the first: '?' marks, clauses, enumerated items, comparisons."""
    t = _normalise(text)
    n = max(0, t.count('?') - 1) + len(_CLAUSE_QUESTION.findall(t))
    for segment in re.split(r"[.?!;:]", t):
        if _CONJ.search(segment):  # "a, b, and c": each comma adds an item
            n += segment.count(',')
    return n + len(_COMPARE.findall(t)) + len(_ORDINAL.findall(t))


_COUNTS = (structural_count, syntactic_count, semantic_count, vague_count, open_ended_count,
           multi_part_count)


def rule_scores(text: str, weights: Optional[Dict[str, float]] = None) -> np.ndarray:
    """Return the six rule scores of ``text`` (weight * count, order RULE_NAMES), shape (6,).

    ``weights`` maps some rule names to finite weights (default 1.0 each).

    Raises:
        TypeError: ``text`` is not a str.
        ValueError: an unknown rule name or a non-finite weight.

    """
    w = dict(DEFAULT_WEIGHTS)
    for name, value in (weights or {}).items():
        if name not in w:
            raise ValueError(f'unknown rule {name!r}; rules are {RULE_NAMES}')
        if not np.isfinite(value):
            raise ValueError(f'weight of {name!r} must be finite, got {value!r}')
        w[name] = float(value)
    return np.array([w[name] * count(text) for name, count in zip(RULE_NAMES, _COUNTS)],
                    dtype=np.float64)
