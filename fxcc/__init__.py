"""fxcc: compiler-as-a-service for PyTorch 2. `torch.compile(model, backend="fxcc")`.

The one import namespace of the project. Its parts live in the repository's top-level folders and
are mapped here by pyproject.toml's package-dir:

- `fxcc.client`: the Dynamo backend, capture, caches, the HTTP client, the plan runtime, the CLI;
- `fxcc.compiler_core`: wire format, keys, lowering to Triton, artifacts (no HTTP, no Redis);
- `fxcc.service`: the FastAPI service and its stores (`pip install 'fxcc[service]'`);
- `fxcc.worker`: the compile worker (`pip install 'fxcc[worker]'`).

`import fxcc` is cheap: it imports neither torch nor the server stack. `fxcc.explain` (which
imports torch) and `fxcc.ClientSettings` load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fxcc.version import __version__

__all__ = ["ClientSettings", "__version__", "explain"]

if TYPE_CHECKING:
    from fxcc.client.explain import explain
    from fxcc.client.settings import ClientSettings


def __getattr__(name: str) -> Any:
    if name == "explain":
        from fxcc.client.explain import explain

        return explain
    if name == "ClientSettings":
        from fxcc.client.settings import ClientSettings

        return ClientSettings
    raise AttributeError(f"module 'fxcc' has no attribute {name!r}")
