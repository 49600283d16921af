"""A scripted EVR judge (answers and verdicts from tables) and the paper's worked case, for the EVR tests."""

from __future__ import annotations

import torch

from rewardkit.judges import JudgeBackend


TITLES = {"reference consistency": "RC", "scene consistency": "SC", "harmony": "H",
          "instruction consistency": "IC", "visual quality": "Q", "overall edit quality": "ALL"}


class ScriptedJudge(JudgeBackend):
    """Answers from tables: per dimension, a list of rounds of K answers; verdicts keyed by rationale."""

    kind = "scripted"

    def __init__(self, answers, verdicts=None, pairwise=(0.7, 0.4)):
        self.answers, self.verdicts, self.pairwise = answers, verdicts or {}, pairwise
        self.fourway = ([0.25] * 4, [0.25] * 4)
        self.rounds: dict[str, int] = {}
        self.gen_calls, self.prob_calls, self.sessions = [], [], 0
        self.n_images: list[int] = []

    @staticmethod
    def _text(conv):
        return " ".join(c["text"] for c in conv[-1]["content"] if c.get("type") == "text")

    def session(self):
        self.sessions += 1
        return super().session()

    def generate(self, conversations, *, n=1, temperature=0.0, max_new_tokens=256, stop=None, seed=None):
        self.gen_calls.append((len(conversations), n, temperature, seed))
        out = []
        for conv in conversations:
            self.n_images.append(sum(1 for c in conv[-1]["content"] if c.get("type") == "image"))
            text = self._text(conv)
            dim = next(s for t, s in TITLES.items() if f"Evaluate only the {t}" in text)
            key = dim + text[:200]
            r = self.rounds.get(key, 0)
            self.rounds[key] = r + 1
            rounds = self.answers[dim]
            answers = rounds[min(r, len(rounds) - 1)]
            out.append(list(answers[-n:]) if r else list(answers[:n]))
        return out

    def choice_probs(self, conversations, choices):
        self.prob_calls.append((len(conversations), tuple(choices)))
        rows = []
        for i, conv in enumerate(conversations):
            if len(choices) == 4:  # judge_4way: rows per order from the table
                rows.append(list(self.fourway[i % 2]))
                continue
            if tuple(choices) == ("A", "B"):
                p = self.pairwise[i % 2]  # P("A") when the pair is shown (a, b) / (b, a)
                rows.append([p, 1 - p])
                continue
            text = self._text(conv)
            p = next((v for k, v in self.verdicts.items() if k in text), 1.0)
            rows.append([p, 1 - p])
        return torch.tensor(rows, dtype=torch.float32)


def cot(tag, s):
    return f"Reason: evidence {tag}\nScore: {s}"


# K = 3 hypotheses per dimension; verdicts per hypothesis (1 = supported)
PAPER_CASE = {
    "RC": ([4, 5, 2], [1, 1, 0]),
    "SC": ([3, 3, 3], [1, 1, 1]),
    "H": ([5, 1, 1], [1, 0, 0]),
    "IC": ([2, 4, 4], [0, 1, 1]),
    "Q": ([5, 5, 4], [1, 1, 1]),
}


def scripted(case=PAPER_CASE, soft=None):
    answers = {d: [[cot(f"{d}{i}", s) for i, s in enumerate(S)]] for d, (S, _) in case.items()}
    verdicts = {f"evidence {d}{i} ": (v if soft is None else soft.get(d, [v] * 3)[i])
                for d, (_, V) in case.items() for i, v in enumerate(V)}
    return ScriptedJudge(answers, verdicts)
