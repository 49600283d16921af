"""A transcription of djghosh13/geneval @ af4902f ``evaluation/summary_scores.py`` (lines 20-45: load the results
with pandas, print the summary), run as a script by a Python that has pandas (a parity environment; rewardkit's
own environment has none): ``python geneval_summary_official.py RESULTS.jsonl``. Lines 14-18 (the class-name
table) are left out: the script loads it and never uses it. Kept line for line so that it computes what the
official script computes; tests/bench/test_geneval.py compares ``rewardkit bench geneval``'s summary with it."""

import sys

import numpy as np
import pandas as pd

# summary_scores.py:22
df = pd.read_json(sys.argv[1], orient="records", lines=True)

# summary_scores.py:26-32
print("Summary")
print("=======")
print(f"Total images: {len(df)}")
print(f"Total prompts: {len(df.groupby('metadata'))}")
print(f"% correct images: {df['correct'].mean():.2%}")
print(f"% correct prompts: {df.groupby('metadata')['correct'].any().mean():.2%}")
print()

# summary_scores.py:36-45
task_scores = []

print("Task breakdown")
print("==============")
for tag, task_df in df.groupby('tag', sort=False):
    task_scores.append(task_df['correct'].mean())
    print(f"{tag:<16} = {task_df['correct'].mean():.2%} ({task_df['correct'].sum()} / {len(task_df)})")
print()

print(f"Overall score (avg. over tasks): {np.mean(task_scores):.5f}")
