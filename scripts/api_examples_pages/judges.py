"""Examples of the Judges API page (api/judges.md): loaded by scripts/api_examples.py."""

EXAMPLES = [(
    "A judge backend of your own, and a reward asking it",
    '''\
import numpy as np
import torch
import rewardkit
from rewardkit.judges.base import ChoiceError, JudgeBackend, check_choices, check_temperature, continues_final_message
from rewardkit.judges.transformers_backend import conversation_images

class RedJudge(JudgeBackend):
    "Answers Yes with probability 0.9 when the image is mostly red, 0.2 otherwise (no model)."
    kind = "red-rule"

    def generate(self, conversations, *, n=1, temperature=0.0, max_new_tokens=256, stop=None, seed=None):
        check_temperature(temperature)
        return [["Yes"] * n for _ in conversations]

    def choice_probs(self, conversations, choices):
        check_choices(choices)
        rows = []
        for conv in conversations:
            (image,) = conversation_images(conv)      # the images of a conversation, in order
            r, g, b = np.asarray(image, dtype=np.float32).reshape(-1, 3).mean(0)
            p = 0.9 if r > g + b else 0.2
            rows.append([p, 1 - p])
        return torch.tensor(rows)

red = np.full((16, 16, 3), (200, 30, 30), np.uint8)
blue = np.full((16, 16, 3), (30, 30, 200), np.uint8)
vqa = rewardkit.load_reward("vqascore", judge=RedJudge(), probability="yes_no")  # P(Yes) renormalised over Yes/No
print([round(s, 4) for s in vqa([red, blue], "a red square").scores.tolist()])
print(vqa.conversation(red, "a red square")[0]["content"][1]["text"])
print(continues_final_message([{"role": "assistant", "content": "Score:"}]))
try:
    RedJudge().choice_probs([], ["Yes", "Yes"])
except ChoiceError as exc:
    print("ChoiceError:", exc)
''',
    '''\
[0.9, 0.2]
Does this figure show "a red square"? Please answer Yes or No.
True
ChoiceError: choices must be distinct non-empty strings, got ['Yes', 'Yes']
'''), (
    "The failure policy: NaN + reason, or raise",
    '''\
import numpy as np
import torch
import rewardkit
from rewardkit.judges.base import JudgeBackend
from rewardkit.judges.policy import (JudgeError, JudgePolicyMixin, call_on_error, call_rows, check_policy,
                                     describe_failure, is_judge_failure, judge_policy, usable_rows)

class DownJudge(JudgeBackend):
    "A judge whose server is down."
    def generate(self, conversations, **kw):
        raise JudgeError("127.0.0.1:8000 refused the connection")

    def choice_probs(self, conversations, choices):
        raise JudgeError("127.0.0.1:8000 refused the connection")

vqa = rewardkit.load_reward("vqascore", judge=DownJudge(), probability="yes_no")   # on_judge_error="auto"
print(isinstance(vqa, JudgePolicyMixin), check_policy("auto", "vqascore"))
out = vqa([np.zeros((8, 8, 3), np.uint8)], "a cat", on_error="nan")             # auto follows the call: NaN
print(out.scores.tolist(), out.valid.tolist(), out.errors)
try:
    vqa([np.zeros((8, 8, 3), np.uint8)], "a cat")                                 # on_error="raise" (default)
except JudgeError as exc:
    print("raised:", exc, "|", is_judge_failure(exc), describe_failure(exc) == out.errors[0])
with call_on_error("nan"):                                                          # the outermost call decides
    with call_on_error("raise"):
        print(judge_policy("auto"), judge_policy("raise"))
print(is_judge_failure(NotImplementedError("unsupported")))                          # a bug: always raised
probs, ok = usable_rows(torch.tensor([[0.7, 0.3], [0.5, 0.7], [float("nan"), 1.0]]), 3, 2)
print([[round(v, 4) for v in row] for row in probs.tolist()], ok.tolist())       # unanswered rows: NaN

class OneRowDown(DownJudge):
    "Sends one request per row (as the OpenAI backend does): a failed request fails only its row."
    isolates_rows = True

    def choice_probs(self, conversations, choices, row_errors=None):
        row_errors[:] = [None, "HTTP 500 after 1 retry"]
        return torch.tensor([[0.8, 0.2], [float("nan"), float("nan")]])

probs, row_errors = call_rows(OneRowDown(), "choice_probs", [[], []], ["Yes", "No"], isolate=True)
print([round(v, 4) for v in probs[0].tolist()], row_errors)
''',
    '''\
True auto
[nan] [False] ['judge call failed: JudgeError: 127.0.0.1:8000 refused the connection']
raised: 127.0.0.1:8000 refused the connection | True True
nan raise
False
[[0.7, 0.3], [nan, nan], [nan, nan]] [True, False, False]
[0.8, 0.2] [None, 'HTTP 500 after 1 retry']
'''), (
    "A tiny local judge (transformers backend)",
    '''\
import numpy as np
import torch
from rewardkit.judges.transformers_backend import TransformersJudge
from rewardkit.testing import tiny_qwen2_5_vl

judge = TransformersJudge(*tiny_qwen2_5_vl(), device="cpu")   # a real Qwen2.5-VL class, random weights
image = np.full((56, 56, 3), (200, 30, 30), np.uint8)
conv = [{"role": "user", "content": [{"type": "image", "image": image},
                                      {"type": "text", "text": "Is it red? Answer Yes or No."}]}]
probs = judge.choice_probs([conv, conv], ["Yes", "No"])
print(probs.shape, probs.dtype, torch.allclose(probs.sum(1), torch.ones(2)))
raw = judge.raw_choice_probs([conv], ["Yes", "No"])                  # full-vocabulary: a row sums to at most 1
print(bool((raw.sum(1) <= 1).all()), torch.allclose(raw / raw.sum(1, keepdim=True), probs[:1]))
texts = judge.generate([conv], n=1, max_new_tokens=4)                 # greedy: one list of n strings per conversation
print(len(texts), len(texts[0]), type(texts[0][0]).__name__)
print(judge.describe()["kind"], judge.stats["images_encoded"])  # 3 calls, the image encoded once in each
''',
    '''\
torch.Size([2, 2]) torch.float32 True
True True
1 1 str
transformers 3
'''), (
    "A judge behind an OpenAI-compatible server (a stand-in on 127.0.0.1)",
    '''\
import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from rewardkit.judges.openai_backend import OpenAIJudge

class StandIn(BaseHTTPRequestHandler):
    "Answers every /v1/chat/completions with the log-probabilities Yes -0.2, No -1.9 (what vLLM would send)."
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        top = [{"token": "Yes", "logprob": -0.2}, {"token": "No", "logprob": -1.9}]
        body = json.dumps({"choices": [{"message": {"role": "assistant", "content": "Yes"},
                                        "logprobs": {"content": [{"token": "Yes", "logprob": -0.2,
                                                                  "top_logprobs": top}]}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
threading.Thread(target=server.serve_forever, daemon=True).start()
judge = OpenAIJudge(f"http://127.0.0.1:{server.server_port}/v1", model="stand-in", server="openai",
                    check_tokens=False, timeout=10)
conv = [{"role": "user", "content": [{"type": "image", "image": np.zeros((8, 8, 3), np.uint8)},
                                      {"type": "text", "text": "Is it black? Answer Yes or No."}]}]
print([round(p, 4) for p in judge.choice_probs([conv], ["Yes", "No"])[0].tolist()])
print(round(1 / (1 + math.exp(-1.9 + 0.2)), 4))                      # by hand: softmax over the two log-probs
print([round(p, 4) for p in judge.raw_choice_probs([conv], ["Yes", "No"])[0].tolist()], round(math.exp(-0.2), 4))
print(judge.generate([conv]), judge.stats["requests"])
judge.close()
server.shutdown()
''',
    '''\
[0.8455, 0.1545]
0.8455
[0.8187, 0.1496] 0.8187
[['Yes']] 3
'''), (
    "vLLM's dtype names",
    '''\
import torch
from rewardkit.judges.vllm_backend import normalize_dtype_name

print([normalize_dtype_name(d) for d in ("bf16", "fp16", torch.float32, "auto")])
''',
    '''\
['bfloat16', 'float16', 'float32', 'auto']
'''), (
    "An offline vLLM judge",
    '''\
# needs a CUDA GPU and the vllm extra (pip install "rewardkit-vision[vllm]"): not run by the test suite
import rewardkit
from rewardkit.judges.vllm_backend import VLLMJudge

judge = VLLMJudge("Qwen/Qwen2.5-VL-7B-Instruct", dtype="bf16", gpu_memory_utilization=0.5, max_model_len=4096)
vqa = rewardkit.load_reward("vqascore", judge=judge)
print(vqa(["image.png"], "a red apple on a table").scores)
''',
    ""),
]
