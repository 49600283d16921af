"""What the published sdist and wheel carry: the licence text pyproject declares, and the recipes / examples /
tests the docs and the test suite use. Built from a copy of the tree, without network (no build isolation)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    pytest.importorskip("setuptools")
    pytest.importorskip("wheel")
    dst = tmp_path_factory.mktemp("src") / "rewardkit"
    shutil.copytree(ROOT, dst, ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info",
                                                             "__pycache__", ".pytest_cache", "outputs", "runs"))
    return dst


def test_license_file_is_the_apache_2_text():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and len(text.splitlines()) == 202  # the full standard text
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'license = "Apache-2.0"' in pyproject and 'license-files = ["LICENSE"]' in pyproject


@pytest.mark.slow
def test_sdist_carries_licence_recipes_examples_and_tests(tree, tmp_path):
    out = tmp_path / "dist"
    code = f"from setuptools import build_meta as b; print(b.build_sdist({str(out)!r}))"
    subprocess.run([sys.executable, "-c", code], cwd=tree, check=True, capture_output=True, timeout=300)
    (sdist,) = out.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for need in ("LICENSE", "recipes/nft/tiny.yaml", "recipes/nft/tiny_e2po.yaml", "recipes/parrot/tiny.yaml",
                 "recipes/arena_rm/tiny.yaml", "examples/quickstart.py", "examples/images/t2i.jsonl",
                 "examples/images/t2i_red_apple.png", "tests/conftest.py", "tests/helpers/vllm_standin.py",
                 "benchmarks/gpu/vllm_smoke.py", "scripts/score.sh",
                 # the docs build and test.sh's system packages (issue 40: the sdist lacked them)
                 "mkdocs.yml", ".ci/install-system-deps.sh", ".importlinter"):
        assert need in names, need
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)


@pytest.mark.slow
def test_wheel_carries_the_licence(tree, tmp_path):
    out = tmp_path / "whl"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", ".", "-w",
                    str(out)], cwd=tree, check=True, capture_output=True, timeout=300)
    (whl,) = out.glob("*.whl")
    with zipfile.ZipFile(whl) as z:
        lic = [n for n in z.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
        assert len(lic) == 1 and z.read(lic[0]) == (ROOT / "LICENSE").read_bytes()
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in meta and "License-File: LICENSE" in meta
