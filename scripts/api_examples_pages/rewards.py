"""Examples of the Rewards API page (api/rewards.md): loaded by scripts/api_examples.py."""

EXAMPLES = [(
    "Every reward on its tiny model",
    '''\
import tempfile

import numpy as np
from rewardkit.rewards.aesthetic import Aesthetic
from rewardkit.rewards.clipscore import CLIPScore
from rewardkit.rewards.constraints import Constraints
from rewardkit.rewards.detectors import Detectors
from rewardkit.rewards.editreward import EditReward
from rewardkit.rewards.evr import EVR
from rewardkit.rewards.faithfulness import Faithfulness, RubricReward
from rewardkit.rewards.hpsv2 import HPSv2
from rewardkit.rewards.hpsv3 import HPSv3
from rewardkit.rewards.imagereward import ImageReward
from rewardkit.rewards.jpeg import JpegCompressibility, JpegIncompressibility
from rewardkit.rewards.ocr import OCRReward
from rewardkit.rewards.pickscore import PickScore
from rewardkit.rewards.preference import PreferenceReward
from rewardkit.rewards.qwenvl import QwenVLAesthetic
from rewardkit.rewards.rational import RationalReward
from rewardkit.rewards.unifiedreward import UnifiedReward
from rewardkit.rewards.vqascore import VQAScore

red = np.full((32, 32, 3), (200, 30, 30), np.uint8)
for cls in (CLIPScore, PickScore, HPSv2, HPSv3, ImageReward, Aesthetic, PreferenceReward, VQAScore, UnifiedReward,
            QwenVLAesthetic, RationalReward, Faithfulness, Constraints, Detectors, OCRReward, JpegCompressibility,
            JpegIncompressibility, EditReward, EVR):
    # each reward's real model class with tiny random weights (rewardkit.testing): the values mean nothing, the
    # shapes, the validity and the reasons are what the real checkpoints give
    reward = cls.tiny(tempfile.mkdtemp())
    if "t2i" in reward.tasks:
        out = reward([red], "a red square", on_error="nan")
    else:                                                      # editing rewards score the edit of a source image
        out = reward([red], "make it red", sources=[red], on_error="nan")
    why = (out.errors[0] or "").split(" (")[0].split("; ")[0].split(" after ")[0]  # its reason, up to the details
    print(f"{reward.name:22} {tuple(out.scores.shape)} {'valid' if out.valid[0] else 'NaN':5} {why}".rstrip())
print(issubclass(Faithfulness, RubricReward), issubclass(Constraints, RubricReward))
''',
    '''\
clipscore              (1,) valid
pickscore              (1,) valid
hpsv2                  (1,) valid
hpsv3                  (1,) valid
imagereward            (1,) valid
aesthetic              (1,) valid
preference             (1,) valid
vqascore               (1,) valid
unifiedreward          (1,) NaN   no 'Final Score:' in the answer
qwenvl                 (1,) NaN   no <Score>N</Score> in the answer
rational               (1,) NaN   unparseable critique: no 'Text Faithfulness:' section
faithfulness           (1,) NaN   no faithfulness questions for this prompt
constraints            (1,) NaN   no intent label for this prompt
detectors              (1,) valid
ocr                    (1,) NaN   not applicable: the prompt requests no quoted text
jpeg-compressibility   (1,) valid
jpeg-incompressibility (1,) valid
editreward             (1,) valid
evr                    (1,) NaN   reference_consistency: 2/2 hypotheses unparseable
True True
'''),
]

EXAMPLES += [(
    "The answer parsers of the judge rewards: a value, or None and the reason",
    '''\
from rewardkit.rewards.qwenvl import parse_score_tag
from rewardkit.rewards.unifiedreward import (parse_axis_scores, parse_edit_scores, parse_final_score,
                                             parse_pair_axis_scores, parse_pair_verdict, parse_think_verdict)

print(parse_final_score("The apple is red. Final Score: 4.5"))
print(parse_final_score("Final Score: 7"))                           # off the 1-5 scale: refused, with why
print(parse_score_tag("<Score>3</Score>"), parse_score_tag("three"))
print(parse_axis_scores("Alignment Score (1-5): 4\\nCoherence Score (1-5): 3\\nStyle Score (1-5): 5"))
print(parse_pair_axis_scores("Alignment Score:\\nImage 1: 0.7\\nImage 2: 0.3", axes=("Alignment",)))
print(parse_pair_verdict("Image 1 is better"), parse_think_verdict("<answer>Image 2 is better</answer>"))
print(parse_edit_scores('{"reasoning": "the hat is blue", "score": [20, 18]}'))
''',
    '''\
(4.5, None)
(None, 'score 7 outside [1, 5]')
(3.0, None) (None, 'no <Score>N</Score> in the answer')
({'alignment': 4.0, 'coherence': 3.0, 'style': 5.0}, None)
({'alignment': (0.7, 0.3)}, None)
(1.0, None) (0.0, None)
([20.0, 18.0], None)
'''), (
    "OCR's text rules and JPEG sizes, by hand",
    '''\
import io

from PIL import Image
from rewardkit.rewards.jpeg import jpeg_size_kb
from rewardkit.rewards.ocr import (edit_distance, extract_quoted, normalize_text, ocr_similarity,
                                   substring_edit_distance)
from rewardkit.rewards.unifiedreward import jpeg_roundtrip

print(extract_quoted('a shop sign that says "OPEN 24h" and "" nothing else'))
print(repr(normalize_text("Open  24H")), repr(normalize_text("Open  24H", whitespace="collapse")))
print(edit_distance("kitten", "sitting"), substring_edit_distance("open", "we are open now"))
print(ocr_similarity("open24h", "opem24h"))                       # 1 - 1 / 7 (one substitution)
image = Image.new("RGB", (64, 64), (90, 140, 200))
buf = io.BytesIO()
image.save(buf, format="JPEG", quality=95)
print(jpeg_size_kb(image) == len(buf.getvalue()) / 1000)          # kB of 1000 bytes, quality 95 by default
print(jpeg_roundtrip(image, 90).size, jpeg_roundtrip(image, 90).mode)
''',
    '''\
['OPEN 24h']
'open24h' 'open 24h'
3 0
(0.8571428571428572, 1)
True
(64, 64) RGB
'''), (
    "A judge reward's judge, and HPSv3's rotary positions",
    '''\
from rewardkit.judges.base import JudgeBackend
from rewardkit.rewards.hpsv3 import resolve_positions
from rewardkit.rewards.vqascore import VQAScoreConfig, judge_from_config

class Always(JudgeBackend):
    def generate(self, conversations, **kw):
        return [["Yes"] for _ in conversations]

    def choice_probs(self, conversations, choices):
        raise NotImplementedError

backend = Always()
print(judge_from_config(backend, VQAScoreConfig(), owner="vqascore") is backend)   # an object: used as is
try:
    judge_from_config(None, VQAScoreConfig(), owner="vqascore")                      # neither: a clear error
except ValueError as exc:
    print(str(exc).split(":")[0])
# the override, else what the converter recorded, else the official positions of the backbone
print(resolve_positions("mrope", {"positions": "sequential"}, "qwen2_vl"),
      resolve_positions("", {"positions": "mrope"}, None), resolve_positions("", {}, "qwen2_vl"))
''',
    '''\
True
vqascore needs a judge
mrope mrope sequential
'''),
]
