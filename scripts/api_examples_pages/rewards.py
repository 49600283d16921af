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
