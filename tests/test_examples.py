"""The examples in examples/ run as documented."""

import runpy
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_quickstart_runs(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["quickstart.py"])
    runpy.run_path(str(EXAMPLES / "quickstart.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "'valid': False" in out and "not a recognised image format" in out
    assert "P(image 0 preferred over image 1) =" in out
