"""Print a pip constraints file pinning every declared lower bound (``name>=X`` -> ``name==X``) of the core
dependencies and of the extras that ``.[all,dev]`` installs. Used by scripts/test-min-deps.sh.

torch is left out on purpose: its floor cannot be installed as a CPU build from PyPI (PyPI's Linux torch
wheels are CUDA builds of several GB); the run uses the torch the environment provides (REWARDKIT_TORCH).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
SKIP = {"torch", "rewardkit-vision"}
NEVER = {"vllm"}  # the vllm extra is never installed by CI (a CUDA build)


def main() -> int:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = meta.get("optional-dependencies", {})
    reqs = list(meta.get("dependencies", []))
    for name, deps in extras.items():
        if name in NEVER or name == "all":
            continue
        reqs += deps
    floors: dict[str, str] = {}
    for req in reqs:
        m = re.match(r"^\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*(.*)$", req)
        if not m:
            continue
        name = m.group(1).lower().replace("_", "-")
        if name in SKIP:
            continue
        for op, ver in re.findall(r"(>=|==)\s*([0-9][0-9A-Za-z.\-+]*)", m.group(3)):
            old = floors.get(name)
            # several extras may declare one package: the highest floor is the one pip must honour
            if old is None or tuple(int(x) if x.isdigit() else 0 for x in re.split(r"[.\-+]", ver)) > \
                    tuple(int(x) if x.isdigit() else 0 for x in re.split(r"[.\-+]", old)):
                floors[name] = ver
    for name in sorted(floors):
        print(f"{name}=={floors[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
