"""PARROT (Preference-Anchored Rationalization): rationales from preference pairs, distilled into a
reasoning reward model (``load_reward("rational", model=...)``).

Stages (``rewardkit parrot rationalize | filter | project | sft | run``):

1. :meth:`~rewardkit.parrot.pipeline.Pipeline.rationalize`: the teacher, shown the pair, the request (+ source) and
   the known label, writes an anchored pairwise rationale (the ELBO's variational posterior).
2. :meth:`~rewardkit.parrot.pipeline.Pipeline.filter`: asked again without the label and without the
   images, given only the rationale (:func:`~rewardkit.parrot.format.consistency_view`: by default in full,
   per-dimension arguments, scores and summary, as the paper; never its ``Preferred:`` line), the teacher
   predicts the preferred image; kept iff prediction == label (term 1 of the ELBO).
3. :meth:`~rewardkit.parrot.pipeline.Pipeline.project`: each image of a kept pair scored alone (1-4 / N/A per
   dimension) with the verified rationale as a hint (pointwise projection).
4. :func:`~rewardkit.parrot.sft.train_sft`: TRL ``SFTTrainer`` on the pairwise + pointwise examples
   (term 2 of the ELBO: the student learns to rationalize without the label).

Importing this package is cheap; stages import their libraries when they run.
"""

__all__ = ["format", "prompts", "pipeline", "sft", "testing"]
