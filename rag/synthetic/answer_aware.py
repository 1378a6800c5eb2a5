"""Answer-aware questions by rule (after Heilman & Smith, 2010): pick an answer phrase in a sentence, take it out,
front a wh-phrase for it and invert the clause that held it ("X completed Y in 1889" -> "When did X complete Y?").

Works on a spaCy parse (rag.synthetic.nlp). Every step that a parse cannot vouch for (an answer in a role the rules
do not know, a relative clause, no finite verb, a pronoun left that only its context explains) rejects the candidate
with a reason instead of emitting a malformed question: a few good questions beat many odd ones.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rag.synthetic.text import content_tokens, has_question_form, tokens

# Entity labels an answer can have, most specific first: the first candidate of a sentence that makes a
# question wins, and a date, a name or a count makes a sharper question than a bare noun phrase.
ANSWER_LABELS = (
    "DATE",
    "TIME",
    "PERSON",
    "CARDINAL",
    "MONEY",
    "PERCENT",
    "QUANTITY",
    "GPE",
    "LOC",
    "FAC",
    "ORG",
    "NORP",
    "EVENT",
    "PRODUCT",
    "WORK_OF_ART",
    "LAW",
)
SUBJECT_DEPS = frozenset({"nsubj", "nsubjpass"})
OBJECT_DEPS = frozenset({"dobj", "attr", "oprd"})
# A date or place after these prepositions is the whole "when"/"where" ("in March 1889" -> When); after others
# the preposition stays in front ("until 1930" -> "Until when").
TIME_PREPS = frozenset({"in", "on", "at", "during"})
PLACE_PREPS = frozenset({"in", "at", "on", "near", "inside", "within", "to"})
KEPT_TIME_PREPS = frozenset({"since", "until", "till", "by"})
WHOM_PREPS = frozenset({"by", "to", "for", "from"})  # not "with": "..., with Daniel Andrews the Premier"
COUNT_PREPS = frozenset({"in", "with", "by", "to", "for", "of", "from"})
MONTHS = re.compile(
    r"\b(jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\b"
    r"|\b(mon|tues|wednes|thurs|fri|satur|sun)day\b|\bcentur(y|ies)\b|\d",
    re.I,
)
# Children of the answer's verb that belong to other clauses or only glue clauses: dropped, so the question keeps
# the one clause that holds the answer and is shorter than its sentence.
OTHER_CLAUSE_DEPS = frozenset({"conj", "cc", "advcl", "parataxis", "punct", "mark", "preconj", "dep", "meta", "intj"})
LEADING_DROPPED_DEPS = frozenset({"advmod", "npadvmod", "advcl", "cc", "punct", "mark", "intj", "discourse", "dep"})
MAX_QUESTION_WORDS = 22  # SQuAD's human questions: 11 words on average, few above 20
MAX_EXTRA_TOKENS = 12  # words of the answer's phrase beyond the answer itself ("Gustave Eiffel, the engineer, ...")
DO_SUPPORT = {"VBD": "did", "VBZ": "does", "VBP": "do"}
DURATION = re.compile(r"\b(years?|months?|weeks?|days?|hours?|minutes?|decades?|centuries|century)\b", re.I)
# A pronoun (or "there") left in the question points at a sentence the reader of the question does not have.
VAGUE_WORDS = frozenset(
    {
        "he",
        "she",
        "it",
        "they",
        "him",
        "her",
        "them",
        "his",
        "its",
        "their",
        "hers",
        "theirs",
        "this",
        "these",
        "those",
        "we",
        "us",
        "our",
        "i",
        "me",
        "my",
        "you",
        "your",
        "there",
        "here",
        "then",
    }
)


@dataclass(frozen=True)
class Question:
    question: str
    answer: str
    sentence: tuple[int, int]  # character span of the source sentence in the parsed text


@dataclass
class _Plan:
    wh: list[str]  # the fronted wh-phrase, lower case
    anchor: Any  # the token whose role in the clause the wh-phrase takes
    removed: set[int]  # token indices taken out of the clause (answer phrase, its preposition)


def answer_text(ent: Any) -> str:
    """The entity's text, with a currency symbol spaCy left outside the entity ("$" + "25")."""
    start = ent.start
    if start > ent.sent.start and ent.doc[start - 1].tag_ == "$":
        start -= 1
    return ent.doc[start : ent.end].text


def candidates(sent: Any) -> list[tuple[Any, str]]:
    """(answer span, kind) in preference order: entities by label, then subject and object noun phrases."""
    ents = [e for e in sent.ents if e.label_ in ANSWER_LABELS]
    ents.sort(key=lambda e: (ANSWER_LABELS.index(e.label_), e.start))
    taken = {i for e in ents for i in range(e.start, e.end)}
    # A bare definite noun ("the company") answers nothing without its context: a noun phrase needs a name or
    # a second word.
    chunks = [
        c
        for c in sent.noun_chunks
        if c.root.dep_ in SUBJECT_DEPS | OBJECT_DEPS
        and c.root.pos_ in ("NOUN", "PROPN")
        and not taken & set(range(c.start, c.end))
        and (c.root.pos_ == "PROPN" or sum(t.pos_ not in ("DET", "PRON") for t in c) >= 2)
    ]
    return [(e, e.label_) for e in ents] + [(c, "NP") for c in chunks]


def _wh_for(span: Any, kind: str) -> tuple[list[str], Any] | str:
    """The wh-words for an answer and the token that carries its role (the counted noun for "how many")."""
    root = span.root
    if kind == "CARDINAL":
        noun = root.head
        if root.dep_ != "nummod" or noun.pos_ not in ("NOUN", "PROPN") or noun.tag_ not in ("NNS", "NNPS"):
            return "number_without_noun"  # "How many" needs something counted
        kept = [
            t.text.lower() if t.pos_ != "PROPN" else t.text
            for t in noun.subtree
            if t.i < noun.i and t.i not in range(span.start, span.end) and t.dep_ in ("amod", "compound")
        ]
        return ["how", "many", *kept, noun.text], noun
    if kind in ("DATE", "TIME"):
        if re.search(r"\bevery\b|\bago\b", span.text, re.I):
            return "frequency_or_relative_date"
        if not MONTHS.search(span.text):
            return "vague_date"  # "the years", "that time": the answer only its context explains
        is_year = re.search(r"\b1\d{3}|20\d\d\b", span.text)
        if any(t.like_num for t in span) and DURATION.search(span.text) and not is_year:
            return ["how", "long"], root
        return ["when"], root
    if kind in ("MONEY", "QUANTITY"):
        return ["how", "much"], root
    if kind == "PERCENT":
        return ["what", "percentage"], root
    if kind == "PERSON":
        return ["who"], root
    if kind in ("GPE", "LOC", "FAC"):
        return (["where"], root) if root.dep_ == "pobj" and root.head.lower_ in PLACE_PREPS else (["what"], root)
    return ["what"], root


def plan(span: Any, kind: str) -> _Plan | str:
    """Which wh-phrase replaces the answer and what is taken out of the clause, or why no question can be made."""
    found = _wh_for(span, kind)
    if isinstance(found, str):
        return found
    wh, anchor = found
    removed = {t.i for t in anchor.subtree}
    if len(removed) > len(span) + MAX_EXTRA_TOKENS:
        return "answer_phrase_too_long"  # a long relative clause would go with the answer, and its facts with it
    if anchor.dep_ in SUBJECT_DEPS | OBJECT_DEPS:
        return _Plan(wh, anchor, removed)
    if anchor.dep_ == "pobj" and anchor.head.dep_ in ("prep", "agent"):
        prep = anchor.head
        removed.add(prep.i)
        if prep.head.pos_ not in ("VERB", "AUX"):
            return "prepositional_phrase_of_a_noun"  # "the fair in Paris": no clause role to ask about
        word = prep.lower_
        if wh == ["when"] and word not in TIME_PREPS:
            if word not in KEPT_TIME_PREPS:
                return "unsupported_preposition"  # "before when" is no English question
            wh = [word, "when"]
        elif wh == ["how", "long"] and word not in ("for", "during"):
            return "unsupported_preposition"
        elif wh == ["where"] and word == "to":
            pass  # "moved to Lyon" -> "Where did ... move?"
        elif wh == ["who"] and word in WHOM_PREPS:
            wh = [word, "whom"]  # "By whom was the tower designed?"
        elif wh[:2] == ["how", "many"] and word in COUNT_PREPS:
            wh = [word, *wh]
        elif wh not in (["when"], ["where"], ["how", "long"]):
            return "unsupported_preposition"  # "At what ...", "To how much ...": rarely English
        return _Plan(wh, prep, removed)
    if (
        anchor.dep_ in ("npadvmod", "tmod")
        and wh in (["when"], ["how", "long"])
        and anchor.head.pos_ in ("VERB", "AUX")
    ):
        return _Plan(wh, anchor, removed)
    return f"answer_role_{anchor.dep_ or 'none'}"


def _subtree_ids(token: Any) -> set[int]:
    return {t.i for t in token.subtree}


def build(span: Any, kind: str) -> Question | str:
    """The question asking for `span` in its sentence, or the reason there is none."""
    p = plan(span, kind)
    if isinstance(p, str):
        return p
    verb = p.anchor.head
    if verb.pos_ not in ("VERB", "AUX"):
        return "answer_not_in_a_clause"
    if verb.dep_ in ("relcl", "acl", "amod", "pcomp", "csubj", "xcomp"):
        return "subordinate_clause"  # its subject is a relative pronoun, elsewhere, or missing
    subjects = [c for c in verb.children if c.dep_ in SUBJECT_DEPS]
    if len(subjects) != 1 or subjects[0].tag_ in ("WDT", "WP", "WP$"):
        return "no_subject"
    subject = subjects[0]
    finite = next((c for c in verb.children if c.dep_ in ("aux", "auxpass") and c.i < verb.i), verb)
    if _disagree(subject, finite):
        return "agreement"  # "surveys ... remains": the tagger took a noun for a verb; the parse is not to be trusted
    clause = _subtree_ids(verb)
    for child in verb.children:
        if child.dep_ in OTHER_CLAUSE_DEPS:
            clause -= _subtree_ids(child)
    clause -= p.removed
    for i in sorted(clause):  # ", a council of chiefs," / ", which ...": asides between commas are not the question
        tok = verb.doc[i]
        comma_before = tok.left_edge.i > 0 and tok.doc[tok.left_edge.i - 1].text == ","
        if tok.dep_ in ("appos", "relcl") and i in clause and comma_before:
            aside = _subtree_ids(tok) | {tok.left_edge.i - 1}
            after = tok.right_edge.i + 1
            if after < len(tok.doc) and tok.doc[after].text == ",":
                aside.add(after)
            clause -= aside
    for i in list(clause):  # an "and" whose conjunct went with another clause or the answer would dangle
        tok = verb.doc[i]
        if tok.dep_ == "cc" and not any(c.dep_ == "conj" and c.i in clause for c in tok.head.children):
            clause.discard(i)
    order = sorted(clause)
    core = _subtree_ids(subject) | {verb.i} | {c.i for c in verb.children if c.dep_ in ("aux", "auxpass", "neg")}
    first_core = min(core)
    moved_to_end: list[int] = []
    for child in verb.children:  # modifiers before the subject ("In Paris, the company built ...")
        ids = _subtree_ids(child) & clause
        if ids and max(ids) < first_core and child.dep_ not in SUBJECT_DEPS | {"aux", "auxpass", "neg"}:
            order = [i for i in order if i not in ids]
            if child.dep_ == "prep":
                moved_to_end += sorted(ids)
            elif child.dep_ not in LEADING_DROPPED_DEPS:
                return "leading_modifier"
    doc = verb.doc
    replaced: dict[int, str] = {}
    fronted: list[int] = []
    if p.anchor.i != subject.i:  # the answer is no subject: invert subject and auxiliary
        auxes = [c for c in verb.children if c.dep_ in ("aux", "auxpass") and c.i < verb.i and c.i in clause]
        if auxes:
            fronted = [auxes[0].i]
        elif verb.lemma_ == "be":
            fronted = [verb.i]
        elif verb.tag_ in DO_SUPPORT:
            replaced[verb.i] = verb.lemma_
        else:
            return "no_finite_verb"
        order = [i for i in order if i not in fronted]
    elif p.anchor.dep_ not in SUBJECT_DEPS:
        return "no_subject"
    words: list[str] = list(p.wh)
    if replaced:
        words.append(DO_SUPPORT[verb.tag_])
    words += [doc[i].lower_ for i in fronted]
    body = _render(doc, order + moved_to_end, replaced, lower={subject.left_edge.i, *(moved_to_end[:1])})
    question = _tidy(" ".join(words) + " " + body)
    # An entity is the answer as named; a noun phrase's answer is all of it ("the largest stadium in Australia").
    answer = answer_text(span) if kind != "NP" else _phrase(p.anchor if p.anchor.dep_ != "prep" else span.root)
    sent = span.sent
    lead, trail = len(sent.text) - len(sent.text.lstrip()), len(sent.text) - len(sent.text.rstrip())
    where = (sent.start_char + lead, sent.end_char - trail)  # spaCy keeps a newline token inside a sentence span
    return _check(question, answer, sent.text) or Question(question, answer, where)


def _phrase(token: Any) -> str:
    return token.doc[token.left_edge.i : token.right_edge.i + 1].text.strip(" ,;:")


def _disagree(subject: Any, finite: Any) -> bool:
    """A finite verb whose number is not its subject's, or "am" without "I": a sign of a mis-tagged sentence."""
    if finite.lower_ == "am":
        return subject.lower_ != "i"
    if any(c.dep_ == "conj" for c in subject.children):
        return False  # "Tesla and Edison were": plural from two singulars
    return (finite.tag_ == "VBZ" and subject.tag_ in ("NNS", "NNPS")) or (
        finite.tag_ == "VBP" and subject.tag_ in ("NN", "NNP")
    )


def _common_word(tok: Any) -> bool:
    """Whether a sentence-initial word is lower case inside a question: not a name, nor capitalised elsewhere."""
    if tok.is_stop or tok.pos_ in ("DET", "ADP", "ADV", "ADJ"):
        return tok.text != "I"
    if tok.pos_ == "PROPN" or tok.ent_type_:
        return False
    return not any(t.text == tok.text for t in tok.doc if t.i != tok.i and not t.is_sent_start)


def _render(doc: Any, ids: list[int], replaced: dict[int, str], lower: set[int]) -> str:
    """Tokens in the given order, keeping the original spacing inside runs of neighbouring tokens."""
    out, prev = [], None
    for i in ids:
        tok = doc[i]
        text = replaced.get(i, tok.text)
        if i in lower and tok.i == tok.sent.start and _common_word(tok):
            text = text.lower()
        if out and prev is not None and i != prev + 1:
            out[-1] = out[-1].rstrip() + " "
        out.append(text + (tok.whitespace_ or ""))
        prev = i
    return "".join(out)


def _tidy(text: str) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    text = re.sub(r"\s+([,;:.%)])", r"\1", text)
    text = re.sub(r"([,;:]\s*)+([,;:])", r"\2", text)
    text = re.sub(r"(?:[\s,;:.!?\-–—]|\b(?:and|or|but|nor)\b)+$", "", text)  # a clause cut after its conjunction
    return (text[:1].upper() + text[1:] + "?") if text else ""


def _check(question: str, answer: str, sentence: str) -> str | None:
    """Why a built question is no good, or None."""
    q_tokens, a_tokens = tokens(question), tokens(answer)
    if not has_question_form(question, strict=True):
        return "no_question_form"
    if a_tokens and any(q_tokens[i : i + len(a_tokens)] == a_tokens for i in range(len(q_tokens))):
        return "answer_in_question"
    if VAGUE_WORDS & set(q_tokens):
        return "pronoun"
    if len(q_tokens) > MAX_QUESTION_WORDS:
        return "too_long"  # people's questions are short; a long one is a long clause copied with a wh-word
    if len(q_tokens) > len(tokens(sentence)):
        return "longer_than_sentence"  # a one-clause sentence cannot get shorter, but a question must not grow
    if question.count("(") != question.count(")") or question.count('"') % 2:
        return "unbalanced"
    if len(content_tokens(question)) < 2:
        return "too_short"  # "What did it do?": nothing left to search for
    return None


def prose_sentences(doc: Any) -> list[Any]:
    """Whole declarative sentences of ordinary prose: a capital or digit first, a full stop last, one line."""
    out = []
    for sent in doc.sents:
        text = sent.text.strip()
        if (
            6 <= len(sent) <= 60
            and text[:1].isupper()
            and text.endswith(".")
            and "\n" not in text
            and sum(ch.isalpha() for ch in text) > 0.6 * len(text)
        ):
            out.append(sent)
    return out


def questions(
    text: str, order: Callable[[list[Any]], list[Any]], accept: Callable[[Question], bool], rejected: Counter, nlp: Any
) -> Iterator[Question]:
    """Accepted questions of `text`, at most one per sentence, sentences in the order `order` gives. Every candidate
    that fails is counted in `rejected` under its reason (one count per answer candidate tried)."""
    # PDF text breaks lines inside sentences; a lone newline becomes a space (same length, so offsets hold), a
    # blank line still ends a paragraph.
    sents = prose_sentences(nlp(re.sub(r"(?<!\n)\n(?!\n)", " ", text)))
    if not sents:
        rejected["no_prose_sentence"] += 1
    for sent in order(sents):
        for span, kind in candidates(sent):
            made = build(span, kind)
            if isinstance(made, str):
                rejected[made] += 1
                continue
            if accept(made):
                yield made
                break
