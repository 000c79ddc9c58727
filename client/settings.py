"""Client settings: environment variables (FXCC_*) overridden by torch.compile(options={...})."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

Fallback = Literal["eager", "inductor", "error"]


@dataclass(frozen=True)
class ClientSettings:
    """Everything the client reads from its environment, in one typed place.

    url: the compile service (FXCC_URL); None compiles in-process (the embedded default).
    token: bearer token for the service (FXCC_TOKEN); never logged.
    signing_key: when set (FXCC_SIGNING_KEY), every artifact from the service must carry a valid
        HMAC signature by the workers' shared key, or it is refused.
    cache_dir: local artifact cache (FXCC_CACHE_DIR, default ~/.cache/fxcc).
    mode: compile mode sent to the service (FXCC_MODE: default | max-autotune).
    fallback: what to do when fxcc cannot serve a graph (FXCC_FALLBACK: eager | inductor | error).
    blocking: wait for a compile (FXCC_BLOCKING=1, default); 0 runs eagerly until it arrives.
    precompile: submit compiles at precompile priority and never wait (FXCC_PRECOMPILE=1).
    compile_timeout_s: how long to wait for a remote compile before falling back.
    cuda_graphs: replay static inference plans of many small steps as CUDA graphs
        (FXCC_CUDA_GRAPHS=1, default; 0 always runs plans step by step; client/cuda_graphs.py).
    pre_aot_cache: serve a plain inference graph that this machine compiled before without
        running AOTAutograd again (FXCC_PRE_AOT_CACHE=1, default; 0 always runs it;
        client/pre_aot.py). Entries live under cache_dir/pre_aot.
    """

    url: str | None = None
    token: str | None = None
    signing_key: str | None = None
    cache_dir: Path = Path.home() / ".cache" / "fxcc"
    mode: Literal["default", "max-autotune"] = "default"
    fallback: Fallback = "eager"
    blocking: bool = True
    precompile: bool = False
    cuda_graphs: bool = True
    pre_aot_cache: bool = True
    compile_timeout_s: float = 600.0
    request_timeout_s: float = 30.0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ClientSettings:
        env = dict(os.environ) if env is None else env
        s = cls()
        values: dict[str, Any] = {}
        if env.get("FXCC_URL"):
            values["url"] = env["FXCC_URL"].rstrip("/")
        if env.get("FXCC_TOKEN"):
            values["token"] = env["FXCC_TOKEN"]
        if env.get("FXCC_SIGNING_KEY"):
            values["signing_key"] = env["FXCC_SIGNING_KEY"]
        if env.get("FXCC_CACHE_DIR"):
            values["cache_dir"] = Path(env["FXCC_CACHE_DIR"])
        if env.get("FXCC_MODE"):
            values["mode"] = env["FXCC_MODE"]
        if env.get("FXCC_FALLBACK"):
            values["fallback"] = env["FXCC_FALLBACK"]
        for name in ("blocking", "precompile", "cuda_graphs", "pre_aot_cache"):
            raw = env.get(f"FXCC_{name.upper()}")
            if raw:
                values[name] = _flag(f"FXCC_{name.upper()}", raw)
        if env.get("FXCC_COMPILE_TIMEOUT_S"):
            values["compile_timeout_s"] = float(env["FXCC_COMPILE_TIMEOUT_S"])
        return replace(s, **values).validated()

    def with_options(self, options: dict[str, Any] | None) -> ClientSettings:
        """These settings overridden by torch.compile(..., options={...})."""
        if not options:
            return self
        known = {f.name for f in fields(self)}
        unknown = set(options) - known
        if unknown:
            raise ValueError(f"unknown fxcc options {sorted(unknown)}; known: {sorted(known)}")
        values = dict(options)
        if "cache_dir" in values:
            values["cache_dir"] = Path(values["cache_dir"])
        return replace(self, **values).validated()

    def validated(self) -> ClientSettings:
        if self.mode not in ("default", "max-autotune"):
            raise ValueError(f"FXCC_MODE must be default or max-autotune, not {self.mode!r}")
        if self.fallback not in ("eager", "inductor", "error"):
            raise ValueError(f"FXCC_FALLBACK must be eager, inductor or error, not {self.fallback!r}")
        return self


def _flag(name: str, raw: str) -> bool:
    v = raw.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be 0 or 1, not {raw!r}")
