"""The `rewardkit` console script: ls, score (paths and JSONL), help, errors."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from rewardkit.cli import COMMANDS, main


def test_help_on_every_command(capsys):
    for cmd in [[]] + [[c] for c in COMMANDS]:
        with pytest.raises(SystemExit) as info:
            main(cmd + ["--help"])
        assert info.value.code == 0
        assert "usage: rewardkit" in capsys.readouterr().out


def test_ls_lists_builtins(capsys):
    assert main(["ls"]) == 0
    out = capsys.readouterr().out
    assert "clipscore" in out and "pickscore" in out and "installed" in out
    assert main(["ls", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    pick = next(r for r in rows if r["name"] == "pickscore")
    assert pick["tasks"] == ["t2i"] and pick["extras"] == ["hf"] and pick["installed"] is True


def test_unknown_reward_suggests(capsys):
    assert main(["score", "--reward", "pickscor", "x.png", "--prompt", "p"]) == 2
    assert "Did you mean 'pickscore'" in capsys.readouterr().err


def test_score_paths_on_fixture_images(tiny_clip_dir, edit_example, tmp_path, capsys):
    images = sorted(str(p) for p in edit_example.glob("target_img_*.png"))
    out_file = tmp_path / "scores.jsonl"
    rc = main(["score", "--reward", "clipscore", "--model", str(tiny_clip_dir), *images, "missing.png",
               "--prompt", "Add a green bowl on the branch", "--set", "convention=cosine", "-o", str(out_file),
               "--batch-size", "2", "--no-progress"])
    assert rc == 3  # finished, one image invalid
    printed = capsys.readouterr()
    rows = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [r["image"] for r in rows] == images + ["missing.png"]
    assert all(r["valid"] for r in rows[:3]) and not rows[3]["valid"] and "file not found" in rows[3]["error"]
    assert all(-1 <= r["score"] <= 1 for r in rows[:3])
    assert "1 of 4 images invalid" in printed.err
    for img in images:
        assert img in printed.out


def test_score_jsonl_with_sources(tiny_clip_dir, edit_example, tmp_path):
    items = tmp_path / "items.jsonl"
    items.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": "Add a green bowl", "images": [str(edit_example / "target_img_1.png"),
                                                  str(edit_example / "target_img_2.png")]},
        {"prompt": "two macaws", "image": str(edit_example / "source_img_1.png")},
    ]))
    out_file = tmp_path / "out.jsonl"
    assert main(["score", "-r", "pickscore", "-m", str(tiny_clip_dir), "--jsonl", str(items), "-o", str(out_file),
                 "--no-progress"]) == 0
    rows = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert len(rows) == 3 and [r["prompt"] for r in rows] == ["Add a green bowl"] * 2 + ["two macaws"]
    # sources on a text-to-image reward: a clear error, not a traceback
    items.write_text(json.dumps({"prompt": "p", "image": "a.png", "sources": ["b.png"]}))
    assert main(["score", "-r", "pickscore", "-m", str(tiny_clip_dir), "--jsonl", str(items), "--no-progress"]) == 2


def test_bad_jsonl_line_is_reported(tmp_path, capsys):
    items = tmp_path / "bad.jsonl"
    items.write_text('{"prompt": "p", "image": "a.png"}\nnot json\n')
    assert main(["score", "-r", "clipscore", "--jsonl", str(items)]) == 2
    assert "bad.jsonl:2: not JSON" in capsys.readouterr().err


def test_unknown_option_lists_it(tiny_clip_dir, capsys):
    assert main(["score", "-r", "clipscore", "-m", str(tiny_clip_dir), "x.png", "-p", "p", "--set", "scael=2"]) == 2
    assert "scael" in capsys.readouterr().err


@pytest.mark.slow
def test_missing_extra_prints_pip_line(tmp_path):
    """With transformers unimportable, the CLI prints the exact pip command, not a traceback."""
    script = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] == 'transformers':
                    raise ModuleNotFoundError("No module named 'transformers'", name='transformers')
        sys.meta_path.insert(0, Block())
        from rewardkit.cli import main
        sys.exit(main(['score', '--reward', 'pickscore', 'x.png', '--prompt', 'p']))
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert res.returncode == 2, res.stderr
    assert "pip install 'rewardkit-vision[hf]'" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.slow
def test_console_script_entry_point():
    res = subprocess.run([sys.executable, "-m", "rewardkit.cli", "--version"], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.startswith("rewardkit ")


def test_reward_construction_errors_are_messages(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("REWARDKIT_DEBUG", raising=False)
    assert main(["score", "-r", "evr", "x.png", "-p", "p"]) == 2
    err = capsys.readouterr().err
    assert "EVR needs a judge" in err and "Traceback" not in err
    assert main(["score", "-r", "clipscore", "-m", str(tmp_path / "missing"), "x.png", "-p", "p"]) == 2
    assert "no such directory" in capsys.readouterr().err
