"""`rewardkit --help` stays fast: building the parser (every command's options) imports no heavy module.
Checked on the import graph of a fresh interpreter, not by timing."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "numpy", "PIL", "transformers", "diffusers", "peft", "trl", "accelerate", "datasets", "vllm",
         "matplotlib", "scipy", "pyarrow", "safetensors", "tqdm", "yaml", "httpx", "huggingface_hub")


def _modules_after(code: str) -> list[str]:
    script = code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_help_imports_no_heavy_module():
    code = ("import contextlib, io\nfrom rewardkit.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        main(['--help'])\n    except SystemExit:\n        pass\n"
            "    for cmd in (['score'], ['compare'], ['bench'], ['train', 'preference'], ['soup'], ['compose', 'score'],"
            " ['calibrate'], ['ls']):\n"
            "        try:\n            main(cmd + ['--help'])\n        except SystemExit:\n            pass\n")
    loaded = _modules_after(code)
    heavy = sorted({m.split(".")[0] for m in loaded} & set(HEAVY))
    assert not heavy, f"`rewardkit --help` imports {heavy}"


def test_every_command_module_is_cheap_to_import():
    from rewardkit.cli import COMMANDS

    loaded = _modules_after("import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in COMMANDS.values()))
    heavy = sorted({m.split(".")[0] for m in loaded} & set(HEAVY))
    assert not heavy, heavy
