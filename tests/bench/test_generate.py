"""``rewardkit generate``: a diffusers pipeline's images in GenEval's layout (generation/diffusers_generate.py of
djghosh13/geneval), read back by ``rewardkit bench geneval``; sharded over torchrun with the same images (the ranks
forked from the test process with torchrun's worker environment: tests/helpers/forked.py)."""

from __future__ import annotations

import json

import pytest

from rewardkit.commands.generate import my_prompts
from tests.helpers.geneval_layouts import METADATA, write_metadata

ARGS = ["--n-samples", "2", "--steps", "2", "--guidance", "1.0", "--height", "32", "--width", "32",
        "--max-sequence-length", "8", "--seed", "7"]


@pytest.fixture(scope="module")
def tiny_sd3_dir(tmp_path_factory):
    from rewardkit.testing import save_tiny_checkpoint

    return save_tiny_checkpoint("sd3", tmp_path_factory.mktemp("gen") / "sd3")


def test_prompts_are_dealt_round_robin():
    assert [my_prompts(5, r, 2) for r in (0, 1)] == [[0, 2, 4], [1, 3]]
    assert sorted(i for r in range(3) for i in my_prompts(7, r, 3)) == list(range(7))


def _layout(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_generate_writes_the_layout_bench_geneval_reads(tmp_path, tiny_sd3_dir, capsys, monkeypatch):
    """The done-when path on a generated tiny set: generate, then `bench geneval` prints the official table."""
    from rewardkit.cli import main
    from tests.helpers.geneval_layouts import register_bright

    meta = write_metadata(tmp_path / "meta.jsonl", METADATA[:3])
    out = tmp_path / "outputs"
    assert main(["generate", "--model", str(tiny_sd3_dir), "--metadata", str(meta), "--outdir", str(out),
                 "--batch-size", "2", *ARGS]) == 0
    files = _layout(out)
    assert sorted(files) == [f"{i:05}/{f}" for i in range(3)
                             for f in ("metadata.jsonl", "samples/00000.png", "samples/00001.png")]
    assert [json.loads(files[f"{i:05}/metadata.jsonl"]) for i in range(3)] == METADATA[:3]
    # every prompt starts from the same seed (diffusers_generate.py:116): a prompt's images do not depend on
    # which prompts came before; two samples of one prompt differ
    assert files["00000/samples/00000.png"] != files["00000/samples/00001.png"]
    mtime = (out / "00001/samples/00000.png").stat().st_mtime_ns
    assert main(["generate", "--model", str(tiny_sd3_dir), "--metadata", str(meta), "--outdir", str(out),
                 *ARGS]) == 0  # complete folders are skipped (a rerun resumes)
    assert (out / "00001/samples/00000.png").stat().st_mtime_ns == mtime
    capsys.readouterr()
    register_bright(monkeypatch)
    assert main(["bench", "geneval", "--images", str(out), "--metadata", str(meta), "--reward", "bright-is-correct",
                 "--outfile", str(tmp_path / "results.jsonl")]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("Summary\n=======\nTotal images: 6\nTotal prompts: 3\n")
    assert "Overall score (avg. over tasks):" in printed


@pytest.mark.slow
@pytest.mark.distributed
def test_two_processes_write_the_same_images_as_one(tmp_path, tiny_sd3_dir):
    from rewardkit.cli import main

    meta = write_metadata(tmp_path / "meta.jsonl", METADATA[:3])
    assert main(["generate", "--model", str(tiny_sd3_dir), "--metadata", str(meta), "--outdir",
                 str(tmp_path / "one"), *ARGS]) == 0
    # ranks 0 and 1 forked from this process with torchrun's worker environment (tests/helpers/forked.py)
    from tests.helpers.forked import run_forked_ranks

    ranks = run_forked_ranks(["generate", "--model", str(tiny_sd3_dir), "--metadata", str(meta), "--outdir",
                              str(tmp_path / "two"), "--device", "cpu", *ARGS],
                             env={"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}, cwd=tmp_path, timeout=300)
    assert [r.returncode for r in ranks] == [0, 0], "\n".join(r.stderr[-3000:] for r in ranks)
    assert "rank 0/2: wrote 4 images for 2 prompts" in ranks[0].stderr
    assert "rank 1/2: wrote 2 images for 1 prompts" in ranks[1].stderr
    assert _layout(tmp_path / "two") == _layout(tmp_path / "one")
