"""Build hand-made artifacts with this machine's Triton into an artifact store, for loading elsewhere.

`python -m bench.prebuild DIR` (CPU is enough). The GPU tests load them when FXCC_PREBUILT_DIR=DIR,
which checks that cubins cross-compiled here run under another machine's torch and Triton.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench.handmade import cos_sin_artifact, cos_sin_request
from fxcc.compiler_core.artifact import save_artifact
from fxcc.compiler_core.build import build_artifact


def main() -> None:
    root = Path(sys.argv[1])
    for n in ((1 << 20) + 5, 1 << 22):
        request = cos_sin_request(n, arch=90)
        save_artifact(root, build_artifact(cos_sin_artifact(request), request, 90))
    print(f"wrote {root}")


if __name__ == "__main__":
    main()
