"""What the commands say when a newcomer trips (issue 40, item 4 and 6): the next command to run is named, the
reasons are printed where the summary says they are, help texts advertise only options that exist, counts agree
with their nouns, and `rewardkit ls` reads as user documentation (no Sphinx roles, no internal wording)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from PIL import Image

from rewardkit.cli import main


def test_score_with_an_official_checkpoint_file_names_the_convert_command(tmp_path, capsys):
    pt = tmp_path / "HPS_v2.1_compressed.pt"
    pt.write_bytes(b"not read: refused before any load")
    for reward in ("hpsv2", "hps"):  # an alias too
        assert main(["score", "-r", reward, "-m", str(pt), "a.png", "-p", "x", "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("rewardkit score: error: ")
        assert f"`rewardkit convert hpsv2 {pt} OUT_DIR`" in err and "--model OUT_DIR" in err
    # a reward whose checkpoints are directories gets no convert line
    assert main(["score", "-r", "clipscore", "-m", str(pt), "a.png", "-p", "x", "--no-progress"]) == 2
    assert "rewardkit convert" not in capsys.readouterr().err


def test_convert_names_heads_when_it_cannot_infer_them(tmp_path, capsys):
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    from rewardkit.convert.tiny import openclip_state_dict, save_tiny_clip_tokenizer

    tok_dir = save_tiny_clip_tokenizer(tmp_path / "tok")
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    src = tmp_path / "odd.safetensors"  # widths 24 / 32: no OpenCLIP default head count for 24
    save_file(openclip_state_dict(vocab=len(tok), context=int(tok.model_max_length), width=24, vision_width=32),
              str(src))
    assert main(["convert", "hpsv2", str(src), str(tmp_path / "out"), "--tokenizer", str(tok_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rewardkit convert: error: ") and "--heads VISION,TEXT" in err


def test_compare_help_advertises_no_option_that_does_not_exist(capsys):
    from rewardkit.cli import build_parser

    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    out = capsys.readouterr().out
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["compare"]
    options = {s for a in sub._actions for s in a.option_strings}
    advertised = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", out))
    assert advertised <= options, advertised - options
    assert "--pairs" not in out


def test_one_result_is_one_result(tiny_clip_dir, tmp_path, capsys):
    img = tmp_path / "a.png"
    Image.fromarray(np.full((16, 16, 3), 90, np.uint8)).save(img)
    out = tmp_path / "o.jsonl"
    assert main(["score", "-r", "clipscore", "-m", str(tiny_clip_dir), str(img), "-p", "x", "-o", str(out),
                 "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert f"wrote 1 result to {out}" in err and "1 results" not in err
    assert main(["score", "-r", "clipscore", "-m", str(tiny_clip_dir), str(img), str(img), "-p", "x", "-o",
                 str(out), "--no-progress"]) == 0
    assert f"wrote 2 results to {out}" in capsys.readouterr().err


def test_ls_reads_as_user_documentation(capsys):
    assert main(["ls"]) == 0
    out = capsys.readouterr().out
    assert not re.search(r":[a-z]+:`", out), out
    for internal in ("seed argues", "module docs", "module docstring", "``"):
        assert internal not in out, internal
    from rewardkit.commands.ls import plain

    assert plain("see :mod:`rewardkit.client` and :class:`~rewardkit.reward.Reward`, ``x``") == \
        "see rewardkit.client and rewardkit.reward.Reward, x"


def test_refine_prints_the_reasons_its_summary_points_to(tmp_path, monkeypatch, capsys):
    """`refine` ended with "reasons above" and printed none (they were only in records.jsonl)."""
    import rewardkit
    from rewardkit.parrot.testing import ScriptedTeacher
    from rewardkit.rewards.rational import RationalReward

    class Mute(ScriptedTeacher):
        def generate(self, conversations, **kw):
            return [["no critique here"] * len(o) for o in super().generate(conversations, **kw)]

    (tmp_path / "gcr_msg_gen.py").write_text(
        "import numpy as np\nfrom PIL import Image\n"
        "def generate(prompts, sources=None, seed=None):\n"
        "    return [Image.fromarray(np.full((32, 32, 3), 30, dtype=np.uint8), 'RGB') for p in prompts]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(rewardkit, "load_reward", lambda name, **kw: RationalReward(judge=Mute()))
    rc = main(["refine", "--generator", "gcr_msg_gen:generate", "--prompt", "a cat", "--prompt", "a dog",
               "-o", str(tmp_path / "out")])
    assert rc == 3
    err = capsys.readouterr().err
    recs = [json.loads(x) for x in (tmp_path / "out" / "records.jsonl").read_text().splitlines()]
    assert "reasons above" in err
    for i, r in enumerate(recs):
        assert r["error_before"] and f"image {i} (before, prompt {r['prompt']!r}): not critiqued: " in err
        assert r["error_before"] in err
    # usage errors read like every other command's (no "ValueError:", no debug hint)
    assert main(["refine", "--generator", "gcr_msg_gen:generate", "-o", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rewardkit refine: error: give requests") and "ValueError" not in err
    assert main(["refine", "--generator", "nonsense", "--prompt", "x", "-o", str(tmp_path / "o3")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rewardkit refine: error: cannot read generator") and "ValueError" not in err
