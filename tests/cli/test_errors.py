"""Errors a user can act on, and exit codes that tell the truth (0 / 1 / 2 / 3, the same in every command)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rewardkit.cli import main

IMAGES = Path(__file__).resolve().parents[2] / "examples" / "images"


@pytest.fixture()
def imgs(tmp_path):
    for name in ("t2i_red_apple.png", "t2i_house_sunset.png"):
        shutil.copy(IMAGES / name, tmp_path / name)
    (tmp_path / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    return tmp_path


def test_cuda_on_cpu_only_torch(tiny_clip_dir, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert main(["score", "-r", "clipscore", "-m", str(tiny_clip_dir), "x.png", "-p", "p", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "no CUDA device is usable" in err and "--device cpu" in err and "Traceback" not in err


def test_missing_model_directory_and_offline_hub_id(capsys, monkeypatch):
    assert main(["score", "-r", "clipscore", "-m", "./no-such-checkpoint", "x.png", "-p", "p"]) == 2
    err = capsys.readouterr().err
    assert "no such directory" in err and "alphanumeric" not in err
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["score", "-r", "clipscore", "-m", "someorg/not-downloaded", "x.png", "-p", "p"]) == 2
    err = capsys.readouterr().err
    assert "someorg/not-downloaded" in err and "--model DIR" in err and "HF_HUB_OFFLINE" in err
    assert "hf download someorg/not-downloaded" in err


@pytest.mark.parametrize("row,msg", [
    ({"prompt": "p", "images": "a.png"}, "'images' must be a list of paths, got the string"),
    ({"prompt": "p", "image": None}, "'image' must be a path"),
    ({"prompt": "p", "image": 3}, "'image' must be a path"),
    ({"prompt": "p", "images": ["a.png", None]}, "every entry must be a non-empty path string"),
    ({"prompt": 5, "image": "a.png"}, "'prompt' must be a string"),
    ({"prompt": "p", "image": "a.png", "sources": [1]}, "'sources' holds 1"),
])
def test_malformed_jsonl_rows_are_input_errors(tmp_path, capsys, row, msg):
    f = tmp_path / "items.jsonl"
    f.write_text(json.dumps({"prompt": "ok", "image": "a.png"}) + "\n" + json.dumps(row) + "\n")
    assert main(["score", "-r", "clipscore", "--jsonl", str(f), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{f}:2:" in err and msg in err


def test_empty_inputs(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["score", "-r", "clipscore", str(tmp_path / "empty"), "-p", "p"]) == 2
    assert "holds no image files" in capsys.readouterr().err
    (tmp_path / "e.jsonl").write_text("\n")
    assert main(["score", "-r", "clipscore", "--jsonl", str(tmp_path / "e.jsonl")]) == 2
    assert "no items" in capsys.readouterr().err


def test_on_error_raise_names_position_in_whole_input_and_path(tiny_clip_dir, imgs, capsys):
    files = [str(imgs / "t2i_red_apple.png"), str(imgs / "t2i_house_sunset.png"), str(imgs / "corrupt.png")]
    rc = main(["score", "-r", "clipscore", "-m", str(tiny_clip_dir), *files, "-p", "p", "--batch-size", "2",
               "--on-error", "raise", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and f"sample 2 ({imgs / 'corrupt.png'})" in err and "corrupt" in err
    # from a JSONL: the file and line too
    f = imgs / "items.jsonl"
    f.write_text("".join(json.dumps({"prompt": "p", "image": Path(x).name}) + "\n" for x in files))
    rc = main(["score", "-r", "clipscore", "-m", str(tiny_clip_dir), "--jsonl", str(f), "--batch-size", "2",
               "--on-error", "raise", "--no-progress"])
    assert rc == 2 and f"{f}:3" in capsys.readouterr().err


def test_exit_codes_all_some_none_scored(tiny_clip_dir, imgs, capsys):
    ok = [str(imgs / "t2i_red_apple.png"), str(imgs / "t2i_house_sunset.png")]
    assert main(["score", "-r", "clipscore", "-m", str(tiny_clip_dir), *ok, "-p", "p", "--no-progress"]) == 0
    assert "all 2 images scored" in capsys.readouterr().err
    rc = main(["score", "-r", "clipscore", "-m", str(tiny_clip_dir), *ok, str(imgs / "corrupt.png"), "-p", "p",
               "--no-progress"])
    printed = capsys.readouterr()
    assert rc == 3 and "1 of 3 images invalid" in printed.err
    bad_line = next(line for line in printed.out.splitlines() if "corrupt.png" in line)
    assert "NaN" in bad_line and "corrupt" in bad_line.split("corrupt.png", 1)[1]  # names the file and why
    rc = main(["score", "-r", "clipscore", "-m", str(tiny_clip_dir), str(imgs / "corrupt.png"), "missing.png",
               "-p", "p", "--no-progress"])
    assert rc == 3 and "none of the 2 images could be scored" in capsys.readouterr().err
    rc = main(["compare", "-r", "clipscore", "-m", str(tiny_clip_dir), *ok, "-p", "a red apple"])
    out = capsys.readouterr().out
    assert rc == 0 and "preferred over" in out


def test_internal_errors_exit_1(monkeypatch, capsys):
    from rewardkit.commands import ls

    def boom(args):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(ls, "run", boom)
    monkeypatch.delenv("REWARDKIT_DEBUG", raising=False)
    assert main(["ls"]) == 1
    err = capsys.readouterr().err
    assert "internal error: RuntimeError: kaboom" in err and "REWARDKIT_DEBUG" in err


def test_usage_errors_exit_2_in_every_command(tmp_path, capsys):
    for argv in (["score", "-r", "clipscore"], ["compare", "-r", "clipscore", "a.png", "-p", "p"],
                 ["bench", "--benchmark", "mmrb2/t2i"], ["calibrate", "--data", "x.jsonl"],
                 ["soup", str(tmp_path)], ["train"],
                 ["compose", "score", "--config", str(tmp_path / "none.yaml"), "--jsonl", "x.jsonl"],
                 # no model loads before these are refused (a bad port was found only after loading the reward)
                 ["serve", "--reward", "clipscore", "--port", "-5"], ["serve", "--reward", "nonexistent"],
                 ["parrot"], ["refine"], ["convert", "hpsv2", str(tmp_path / "none.pt"), str(tmp_path / "out")],
                 ["rl", "nft", "--config", str(tmp_path / "none.yaml")], ["rl", "nft", "--preset", "nosuch"]):
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse's own usage errors (a missing required option) exit 2 directly
            rc = exc.code
        assert rc == 2, argv
        assert "error" in capsys.readouterr().err.lower(), argv


def test_serve_refuses_a_bad_port_before_loading_the_reward(monkeypatch, capsys):
    """`--port -5` is a usage error found before any model loads (it was found only after loading the reward,
    which without weights or network took the hub's retries first)."""
    pytest.importorskip("uvicorn")
    import rewardkit.server as srv

    def boom(*a, **k):
        raise AssertionError("the reward was loaded before the port was checked")

    monkeypatch.setattr(srv, "load_replicas", boom)
    assert main(["serve", "--reward", "clipscore", "--port", "-5"]) == 2
    assert "--port must be in 0..65535" in capsys.readouterr().err


def test_rl_nft_checks_the_rl_extra_before_building_the_reward(monkeypatch, capsys, missing="diffusers"):
    """`rl nft` without the `rl` extra: exit 2 naming the extra, before the reward (a model load, maybe a
    download) is built (it was built first, then the trainer failed on the missing package)."""
    import sys

    from rewardkit.cli import main

    import types

    monkeypatch.setitem(sys.modules, missing, None)  # `import diffusers` / `import peft` raises ImportError

    def built(*a, **k):
        raise AssertionError("the reward was built before the rl extra was checked")

    trainer = types.ModuleType("rewardkit.rl.trainer")  # train_nft builds the reward first thing
    trainer.train_nft = built
    monkeypatch.setitem(sys.modules, "rewardkit.rl.trainer", trainer)
    assert main(["rl", "nft", "--config", "recipes/nft/tiny.yaml"]) == 2
    err = capsys.readouterr().err
    assert missing in err and "rewardkit-vision[rl]" in err
