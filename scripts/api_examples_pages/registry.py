"""More examples of the Registry page (api/registry.md): loaded by scripts/api_examples.py."""

EXAMPLES = [(
    "Registering a reward under a name of your own",
    '''\
import rewardkit
from rewardkit.errors import RegistryError
from rewardkit.registry import conflicts, get_reward_class, register_reward

register_reward("small-jpeg", "rewardkit.rewards.jpeg:JpegCompressibility")   # "module:Class" or the class
print(get_reward_class("small-jpeg").__name__, "small-jpeg" in rewardkit.list_rewards())
try:
    register_reward("pickscore", "rewardkit.rewards.jpeg:JpegCompressibility")
except RegistryError as exc:
    print(str(exc).split(";")[0])
print(conflicts())                          # names two installed plugins claim (none here)
''',
    '''\
JpegCompressibility True
reward name 'pickscore' is already registered to 'rewardkit.rewards.pickscore:PickScore'
{}
'''),
(
    "Why a host's reward name is refused",
    '''\
from rewardkit.registry import refusal_reason

print(refusal_reason("video-ocr"))         # case and '-' vs '_' forgiven
print(refusal_reason("pickscore"))         # a name rewardkit serves is not refused
''',
    '''\
flow_grpo's video_ocr scores videos (5-D frame tensors); rewardkit scores images: use 'ocr' for images
None
'''),
]
