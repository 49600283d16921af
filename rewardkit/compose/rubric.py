"""Rubric machinery shared by the faithfulness, constraint and detector rewards.

- :class:`QuestionTree`: yes/no questions with parent links (Davidsonian-scene-graph style). A question whose
  parent was answered "no" is not asked and counts as "no"; the score is the fraction of "yes". A question
  the judge gave no usable probability for is *unanswered* (never "no"): its children are not asked and the
  tree's score is NaN with a reason naming it.
- :func:`generate_trees` / :func:`classify_intents`: offline, text-only judge calls that turn prompts into
  question trees / intent labels (strict, neutral, open), kept in a :class:`RubricCache` (JSONL keyed by
  prompt) so scoring never regenerates them.
- :func:`answer_trees`: asks every image its questions level by level, one batched ``choice_probs`` call
  per tree level across all images; conversations put the image first so the backend encodes each image
  once and shares the image prefix across that image's questions.
"""

from __future__ import annotations

import json
import math
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..config import iter_jsonl

__all__ = ["Question", "QuestionTree", "RubricCache", "parse_question_list", "tree_score", "answer_trees",
           "generate_trees", "classify_intents", "parse_intent", "yes_no_conversation", "unanswered"]


@dataclass(frozen=True)
class Question:
    id: str
    text: str
    parents: tuple[str, ...] = ()


@dataclass
class QuestionTree:
    """Questions in dependency order; ``parents`` name earlier questions' ids.

    Raises ``ValueError`` on duplicate ids, unknown parents or cycles.
    """

    questions: list[Question] = field(default_factory=list)

    def __post_init__(self) -> None:
        ids = [q.id for q in self.questions]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate question ids: {ids}")
        known = set(ids)
        for q in self.questions:
            bad = [p for p in q.parents if p not in known or p == q.id]
            if bad:
                raise ValueError(f"question {q.id!r} has unknown parent(s) {bad}")
        self._levels = self._compute_levels()

    def _compute_levels(self) -> list[list[Question]]:
        depth: dict[str, int] = {}
        by_id = {q.id: q for q in self.questions}
        visiting: set[str] = set()

        def d(qid: str) -> int:
            if qid in depth:
                return depth[qid]
            if qid in visiting:
                raise ValueError(f"question tree has a cycle through {qid!r}")
            visiting.add(qid)
            depth[qid] = 1 + max((d(p) for p in by_id[qid].parents), default=-1)
            visiting.discard(qid)
            return depth[qid]

        for q in self.questions:
            d(q.id)
        levels: list[list[Question]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
        for q in self.questions:
            levels[depth[q.id]].append(q)
        return levels

    @property
    def levels(self) -> list[list[Question]]:
        """Questions grouped by depth (level 0: no parents)."""
        return self._levels

    def __len__(self) -> int:
        return len(self.questions)

    def to_list(self) -> list[dict[str, Any]]:
        return [{"id": q.id, "question": q.text, "parents": list(q.parents)} for q in self.questions]

    @classmethod
    def from_list(cls, items: Iterable[Any]) -> "QuestionTree":
        """From ``[{"id", "question", "parents"}]`` dicts or plain strings (a flat list). Parent id 0 = none."""
        if isinstance(items, (str, bytes, dict)) or not isinstance(items, Iterable):
            raise ValueError(f"a question tree is a list of questions, got {type(items).__name__}")
        qs = []
        for k, it in enumerate(items, 1):
            if isinstance(it, str):
                if not it.strip():
                    raise ValueError(f"question {k} is empty")
                qs.append(Question(str(k), it.strip()))
                continue
            if not isinstance(it, dict) or not isinstance(it.get("question"), str) or not it["question"].strip():
                raise ValueError(f"question {k}: expected {{'id', 'question', 'parents'}}, got {it!r}")
            parents = it.get("parents")
            if parents is None:
                parents = []
            if not isinstance(parents, (list, tuple)):
                parents = [parents]
            qid = _question_id(it.get("id", k), k)
            if qid in ("0", "None"):
                raise ValueError(f"question {k}: id {qid!r} is reserved (parent 0 / None means 'no parent')")
            pids = []
            for p in parents:
                if p is None or (isinstance(p, (int, str)) and not isinstance(p, bool) and str(p).strip() in ("0", "")):
                    continue
                pids.append(_question_id(p, k))
            qs.append(Question(qid, it["question"].strip(), tuple(pids)))
        return cls(qs)


def _question_id(value: Any, k: int) -> str:
    """An id is an int or a non-empty string (not a bool, float, list...)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip():
        raise ValueError(f"question {k}: id / parent {value!r} is not an int or a non-empty string")
    return str(value).strip()


def tree_score(tree: QuestionTree, answers: dict[str, bool | None]) -> float:
    """Fraction of questions answered "yes"; unasked questions (a parent failed) count as "no".

    ``answers`` maps asked question ids to the verdict: True, False, or None for *unanswered* (the judge gave
    no usable probability). A question counts as "yes" only if it was asked, answered yes, and every ancestor
    was answered yes (enforced here too, so the function is total). A question whose ancestors all said yes
    but that is unanswered (None) or missing makes the score unknown: NaN.
    """
    if len(tree) == 0:
        raise ValueError("an empty question tree has no score")
    ok: dict[str, bool | None] = {}
    for level in tree.levels:
        for q in level:
            parents = [ok[p] for p in q.parents]
            if any(v is False for v in parents):
                ok[q.id] = False          # gated off by a "no": known
            elif any(v is None for v in parents):
                ok[q.id] = None           # gated by an unknown answer: unknown
            else:
                a = answers.get(q.id, None)
                ok[q.id] = None if a is None else bool(a)
    if any(v is None for v in ok.values()):
        return math.nan
    return sum(bool(v) for v in ok.values()) / len(tree)


def unanswered(tree: QuestionTree, probs: dict[str, float]) -> list[Question]:
    """The asked questions of ``tree`` whose P(yes) in ``probs`` is not a usable probability."""
    return [q for q in tree.questions if q.id in probs and not _usable(probs[q.id])]


def _usable(p: Any) -> bool:
    return isinstance(p, float) and math.isfinite(p) and 0.0 <= p <= 1.0


_MAX_QUESTIONS = 200


def _is_question_list(value: Any) -> bool:
    if isinstance(value, dict):
        value = value.get("questions") if set(value) == {"questions"} else None
    if not isinstance(value, list) or not value or len(value) > _MAX_QUESTIONS:
        return False
    return all((isinstance(it, str) and it.strip()) or
               (isinstance(it, dict) and isinstance(it.get("question"), str) and it["question"].strip())
               for it in value)


def _extract_json(text: str) -> Any:
    """The one JSON question list (or ``{"questions": [...]}``) in ``text``: code fences and prose around it
    are ignored; none, or several different ones, is a ValueError."""
    if not isinstance(text, str):
        raise ValueError(f"the judge's answer is not text: {type(text).__name__}")
    text = re.sub(r"```(?:json)?", "", text)
    decoder = json.JSONDecoder()
    found: list[Any] = []
    end = 0
    for m in re.finditer(r"[\[{]", text):
        if m.start() < end:
            continue  # inside a value already decoded
        try:
            value, stop = decoder.raw_decode(text, m.start())
        except (json.JSONDecodeError, RecursionError):
            continue
        end = stop
        if _is_question_list(value) and value not in found:
            found.append(value)
    if not found:
        raise ValueError(f"no JSON list of questions in the judge's answer: {text[:200]!r}")
    if len(found) > 1:
        raise ValueError(f"the judge's answer holds {len(found)} different question lists")
    return found[0]


def parse_question_list(text: str) -> QuestionTree:
    """Parse a generator's answer: exactly one JSON list of questions (strings or ``{id, question,
    parents}`` objects, at most 200), possibly in a code fence, with prose around it or under a
    "questions" key. Anything else (no list, several different lists, a list of numbers, empty questions,
    bad ids / parents) is a ValueError."""
    data = _extract_json(text)
    if isinstance(data, dict):
        data = data.get("questions")
    return QuestionTree.from_list(data)


_LABELS = ("strict", "neutral", "open")
_INTENT_PREFIX = re.compile(r"^(?:the\s+)?(?:intent|label|answer|classification|category)\s*(?:is)?\s*[:=\-]?\s*",
                            re.IGNORECASE)
_LEAD = re.compile(r"^(strict|neutral|open)\b\s*(.*)$", re.IGNORECASE | re.DOTALL)
_HEDGE = re.compile(r"^(?:or|and|/|\\|\?|-?\s*(?:maybe|possibly|perhaps|probably))\b|^[/?\\]", re.IGNORECASE)
_NEGATION = re.compile(r"\b(?:not|no|never|neither|nor|rather|instead|isn|isnt|cannot|can|unsure|unclear|"
                       r"either|or|but|maybe|perhaps|possibly)\b|n't", re.IGNORECASE)


def parse_intent(text: str) -> str:
    """The intent label an answer gives: an answer that leads with a label ("Strict - because ...",
    "**Open**", "Intent: neutral") unless it hedges right after it ("strict or open", "strict/open",
    "strict?"); else a short answer (<= 12 words) naming exactly one label with no negation or hedge ("The
    prompt is neutral."). Anything else is a ValueError ("The prompt is not strict", "either strict or open")."""
    if not isinstance(text, str):
        raise ValueError(f"the intent answer is not text: {type(text).__name__}")
    t = re.sub(r"[*_`#>\"]+", " ", text).strip()
    t = _INTENT_PREFIX.sub("", t).strip()
    m = _LEAD.match(t)
    if m:
        if _HEDGE.match(m.group(2).strip()):
            raise ValueError(f"the intent answer hedges between labels: {text[:200]!r}")
        return m.group(1).lower()
    words = re.findall(r"[A-Za-z']+", t)
    found = {w.lower() for w in words if w.lower() in _LABELS}
    if len(found) == 1 and len(words) <= 12 and not _NEGATION.search(t):
        return found.pop()
    raise ValueError(f"expected one of strict/neutral/open, got {text[:200]!r}")


class RubricCache:
    """Prompt -> record (``questions``, ``intent``, ``error``, provenance), stored as JSONL.

    Records are appended as they are made, so an interrupted generation keeps its work; the last record for
    a prompt wins. Thread-safe. ``path=None`` keeps records in memory only.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path else None
        self._records: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        if self.path is not None and self.path.is_file():
            for lineno, rec in iter_jsonl(self.path):
                if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str):
                    raise ValueError(f"{self.path}:{lineno}: each line needs a 'prompt' string")
                self._records[rec["prompt"]] = rec

    def __contains__(self, prompt: str) -> bool:
        return prompt in self._records

    def __len__(self) -> int:
        return len(self._records)

    def get(self, prompt: str) -> dict[str, Any] | None:
        return self._records.get(prompt)

    def put(self, prompt: str, **fields: Any) -> dict[str, Any]:
        with self._lock:
            rec = dict(self._records.get(prompt) or {"prompt": prompt})
            rec.update(fields)
            self._records[prompt] = rec
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            return rec

    def tree(self, prompt: str) -> QuestionTree | None:
        rec = self._records.get(prompt)
        if not rec or not rec.get("questions"):
            return None
        return QuestionTree.from_list(rec["questions"])

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_lock")
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()


def yes_no_conversation(images: Sequence[Any], text: str, system: str | None = None) -> list[dict[str, Any]]:
    """Images first, then the question: the image prefix is shared by every question about them."""
    conv: list[dict[str, Any]] = []
    if system:
        conv.append({"role": "system", "content": system})
    conv.append({"role": "user", "content": [*({"type": "image", "image": im} for im in images),
                                             {"type": "text", "text": text}]})
    return conv


def answer_trees(judge: Any, images: Sequence[Any], trees: Sequence[QuestionTree | None], *, question_format: str,
                 system: str | None, choices: Sequence[str] = ("Yes", "No"), threshold: float = 0.5,
                 failures: dict[int, str] | None = None) -> list[dict[str, float]]:
    """P(yes) for every asked question of every image.

    Level by level: one ``choice_probs`` call per tree depth holding every (image, question) whose parents
    were all answered "yes" (P(yes) > ``threshold``). Returns, per image, ``{question id: P(yes)}`` for the
    asked questions (unasked ones are absent); an asked question the judge gave no usable probability for
    (a NaN row, a row outside [0, 1] or not summing to 1) has NaN: it is unanswered, its children are not
    asked. ``trees[i] = None`` asks nothing for image i. A ``choice_probs`` result of the wrong shape raises
    :class:`~rewardkit.judges.JudgeError`.

    ``failures``: a dict to isolate failing requests (backends with ``isolates_rows``): a question whose
    request failed after its retries is NaN and ``failures[i]`` names it with the error, instead of the
    whole call raising.
    """
    from ..judges.policy import call_rows, usable_rows

    probs: list[dict[str, float]] = [{} for _ in images]
    depth = max((len(t.levels) for t in trees if t is not None), default=0)
    with judge.session():
        for level in range(depth):
            convs, where = [], []
            for i, t in enumerate(trees):
                if t is None or level >= len(t.levels):
                    continue
                for q in t.levels[level]:
                    # asked only when every parent is a usable "yes" (NaN > threshold is False: unanswered
                    # parents gate their children off, and the tree is NaN anyway)
                    if all(_usable(probs[i].get(p)) and probs[i][p] > threshold for p in q.parents):
                        convs.append(yes_no_conversation([images[i]], question_format.format(question=q.text), system))
                        where.append((i, q.id))
            if not convs:
                break
            raw, errs = call_rows(judge, "choice_probs", convs, list(choices), isolate=failures is not None)
            p, _ = usable_rows(raw, len(convs), len(choices))
            for (i, qid), row, err in zip(where, p, errs):
                probs[i][qid] = float(row[0]) if err is None else math.nan  # NaN when the row was unusable
                if err is not None and failures is not None:
                    failures.setdefault(i, f"question {qid}: {err}")
    return probs


def _text_conversation(system: str | None, text: str) -> list[dict[str, Any]]:
    conv: list[dict[str, Any]] = []
    if system:
        conv.append({"role": "system", "content": system})
    conv.append({"role": "user", "content": [{"type": "text", "text": text}]})
    return conv


def _progress(seq, desc: str, show: bool):
    if not show:
        return seq
    from tqdm.auto import tqdm

    return tqdm(seq, desc=desc, unit="batch")


def generate_trees(judge: Any, prompts: Sequence[str], template: Any, *, cache: RubricCache | None = None,
                   field_prefix: str = "generate", batch_size: int = 16, max_new_tokens: int = 1024,
                   progress: bool = False, skip_cached: bool = True) -> RubricCache:
    """Ask the judge (text-only, greedy) to decompose each prompt into a question tree; store in ``cache``.

    ``template`` supplies ``{field_prefix}_system`` and ``{field_prefix}_prompt`` (with a ``{prompt}``
    placeholder). A prompt whose answer does not parse is stored with ``questions: []`` and the ``error``,
    never with made-up questions.
    """
    cache = cache if cache is not None else RubricCache()
    todo = [p for p in dict.fromkeys(prompts) if not (skip_cached and cache.tree(p) is not None)]
    system = template.get(f"{field_prefix}_system")
    starts = _progress(range(0, len(todo), batch_size), f"questions ({template.id})", progress)
    for s in starts:
        chunk = todo[s:s + batch_size]
        convs = [_text_conversation(system, template.render(f"{field_prefix}_prompt", prompt=p)) for p in chunk]
        outs = judge.generate(convs, n=1, temperature=0.0, max_new_tokens=max_new_tokens)
        for p, out in zip(chunk, outs):
            try:
                tree = parse_question_list(out[0])
                if len(tree) == 0:
                    raise ValueError("empty question list")
                cache.put(p, questions=tree.to_list(), error=None, template=template.id, generator=judge.describe())
            except ValueError as exc:
                cache.put(p, questions=[], error=f"unparsed generator answer: {exc}", raw=out[0][:2000],
                          template=template.id, generator=judge.describe())
    return cache


def classify_intents(judge: Any, prompts: Sequence[str], template: Any, *, cache: RubricCache | None = None,
                     batch_size: int = 16, max_new_tokens: int = 64, progress: bool = False) -> RubricCache:
    """Label each prompt strict / neutral / open with the template's ``intent_system`` / ``intent_prompt``.

    An answer naming no single label is stored as ``intent: None`` with the error (the seed's classifier
    failed on 12 of 10k prompts; those prompts get no constraint gate).
    """
    cache = cache if cache is not None else RubricCache()
    todo = [p for p in dict.fromkeys(prompts) if (cache.get(p) or {}).get("intent") is None]
    system = template.get("intent_system")
    for s in _progress(range(0, len(todo), batch_size), f"intent ({template.id})", progress):
        chunk = todo[s:s + batch_size]
        convs = [_text_conversation(system, template.render("intent_prompt", prompt=p)) for p in chunk]
        outs = judge.generate(convs, n=1, temperature=0.0, max_new_tokens=max_new_tokens)
        for p, out in zip(chunk, outs):
            try:
                cache.put(p, intent=parse_intent(out[0]), intent_error=None, intent_template=template.id)
            except ValueError as exc:
                cache.put(p, intent=None, intent_error=f"unparsed intent answer: {exc}", intent_template=template.id)
    return cache
