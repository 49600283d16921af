"""More examples of the Serving page (api/serve.md): loaded by scripts/api_examples.py."""

EXAMPLES = [(
    "The client's wire helpers, a server that is down, and replicas",
    '''\
import os

from PIL import Image
from rewardkit.serve.client import RemoteReward, RemoteRewardError, encode_image, image_bytes, parse_urls
from rewardkit.server import app_from_env, load_replicas

print(parse_urls("http://127.0.0.1:8000/, http://127.0.0.1:8001"))   # replicas: round-robin, retried on the next
image = Image.new("RGB", (2, 1), (255, 0, 0))
desc, raw = image_bytes(image, "raw")                                 # uint8 RGB pixels as they are
print(desc, raw == bytes([255, 0, 0, 255, 0, 0]))
wire = encode_image(image, "png")                                     # the JSON body's form: base64 text
print(type(wire).__name__)
try:
    RemoteReward(url="http://127.0.0.1:9", timeout=2.0, max_retries=0)   # nothing listens there
except RemoteRewardError as exc:
    print("RemoteRewardError:", str(exc).split(": http")[0])
replicas = load_replicas("jpeg-compressibility", None, {}, ["cpu"])  # one reward per device
print([r.name for r in replicas])
try:
    load_replicas("jpeg-compressibility", None, {}, ["cuda:0", "cuda:1"])
except ValueError as exc:
    print(exc)
os.environ["REWARDKIT_SERVE_REWARD"] = "jpeg-compressibility"        # what `uvicorn --factory` reads
app = app_from_env()
del os.environ["REWARDKIT_SERVE_REWARD"]
print(sorted(route.path for route in app.routes if route.path.startswith(("/score", "/info"))))
''',
    '''\
['http://127.0.0.1:8000', 'http://127.0.0.1:8001']
{'shape': [1, 2, 3], 'dtype': 'uint8'} True
str
RemoteRewardError: GET /info on http://127.0.0.1:9 failed after 1 attempts
['jpeg-compressibility']
reward 'jpeg-compressibility' has no device option: run one replica
['/info', '/score']
'''),
]
