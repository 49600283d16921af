"""GenEval (Ghosh et al. 2023) as a reward: a COCO instance detector and a CLIP colour classifier judge whether an
image shows what its prompt's GenEval metadata asks (objects, counts, colours, relative positions).

    >>> rk = load_reward("geneval", model="geneval/")          # written by `rewardkit convert geneval ...`
    >>> out = rk(images, prompts, metadata=[{"tag": "counting", "include": [{"class": "clock", "count": 2}],
    ...                                     "exclude": [{"class": "clock", "count": 3}],
    ...                                     "prompt": "a photo of two clocks"}])

``metadata[i]`` is one line of GenEval's ``prompts/evaluation_metadata.jsonl`` (``tag``, ``include``, ``exclude``,
``prompt``; an include entry is ``{"class", "count"[, "color"][, "position": [relation, index]]}``). A sample
without it, or with a malformed one (unknown tag / class / colour / relation, a count below 1, a position that
refers to a later entry), is NaN with the reason, never 0.

Forms (``form=``), named as flow_grpo / DiffusionNFT log them (their ``multi_score`` keys):

- ``"accuracy"`` (default): GenEval's own verdict, 1.0 when every requirement holds, else 0.0 (``correct`` in
  djghosh13/geneval ``evaluation/evaluate_images.py``: at least ``count`` objects, the asked colour and side,
  no excluded class) -- what the GenEval benchmark counts; flow_grpo's reward server returns it as ``rewards``.
- ``"strict_accuracy"``: the reward server's ``strict_rewards`` (yifan123/reward-server ``gen_eval.py``
  ``evaluate_reward``): *exactly* ``count`` objects and ``count`` of the asked colour; ``exclude`` not checked.
- ``"score"``: the reward server's partial ``scores``, the value flow_grpo / DiffusionNFT train on as
  ``geneval``: the mean of per-requirement terms (``1 - |count - found| / count`` ...; can be negative), see
  :func:`rewardkit.rewards.geneval_rules.evaluate_reward`.

All three are always computed and returned as ``dimensions`` (``accuracy``, ``strict_accuracy``, ``score``).

Per-sample ``details`` (a dict per sample; None for an invalid sample) -- the keys of the record GenEval's
``evaluate_images.py`` writes (EI:238-249), so a benchmark writer adds ``filename`` and dumps the rest as is:

- ``tag`` (str), ``prompt`` (str: ``metadata["prompt"]``, else the call's prompt)
- ``correct`` (bool): GenEval's verdict
- ``reason`` (str): GenEval's reasons for a 0, one per line, in its words (``expected clock>=2, found 1``,
  ``expected red car>=1, found 0 red; and 1 blue``, ``expected dog right of target, found left of target``,
  ``no target for dog to be right of``, ``expected clock<3, found 3``); empty when correct
- ``metadata`` (str): ``json.dumps(metadata)``, as GenEval writes it
- ``details`` (str): ``json.dumps({class name: [[x1, y1, x2, y2, score], ...]})``, the kept detections per class
  in decreasing score, as GenEval writes them

and the reward server's extra fields (reward-server ``gen_eval.py``, ``evaluate_image``):

- ``strict_correct`` (bool), ``score`` (float): the ``strict_accuracy`` / ``score`` forms' values
- ``strict_reason`` (str): the reason ``evaluate_reward`` gives (the server returns it as ``reason``)

plus ``colors`` (dict: class name -> the colour CLIP gave each judged object, only for classes whose colour was
asked).

Detector: Mask2Former (Swin-S, COCO instances; ``mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco``) run on
transformers' ``Mask2FormerForUniversalSegmentation`` (no mmcv / mmdet), converted once from the official mmdet
checkpoint by ``rewardkit convert geneval``; mmdet's test pipeline and instance post-processing are reimplemented
in :mod:`rewardkit.rewards._geneval_detect`. Colours: CLIP ViT-L/14 (OpenAI) zero-shot on each object's masked
crop over a grey (#999) background, GenEval's three templates averaged as clip_benchmark does.
Rule constants (score threshold 0.3, 0.9 for ``counting``, 16 objects per class, no NMS, position margin 0.1):
:mod:`rewardkit.rewards.geneval_rules`.
"""
