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
    trusted_keys: the workers' Ed25519 public keys (FXCC_TRUSTED_KEYS: keys or files of keys,
        separated by commas; several at once for rotation). Every artifact from a service must carry a
        valid signature by one of them, or by the local `fxcc serve`'s own key (its data dir's
        keys/signing.pub), or it is refused before any of it is loaded.
    allow_unsigned: load artifacts from a service without checking signatures
        (FXCC_ALLOW_UNSIGNED=1): whoever can write the service's cache then runs code in this
        process. An explicit opt-out; `fxcc doctor` warns of it.
    cache_dir: local artifact cache (FXCC_CACHE_DIR, default ~/.cache/fxcc).
    mode: compile mode sent to the service (FXCC_MODE: default | max-autotune).
    fallback: what to do when fxcc cannot serve a graph (FXCC_FALLBACK: eager | inductor | error).
    blocking: wait for a compile (FXCC_BLOCKING=1, default); 0 runs eagerly until it arrives.
    precompile: submit compiles at precompile priority and never wait (FXCC_PRECOMPILE=1).
    compile_timeout_s: how long to wait for a remote compile before falling back.
    cuda_graphs: replay static inference plans of many small steps as CUDA graphs
        (FXCC_CUDA_GRAPHS=1, default; 0 always runs plans step by step; client/cuda_graphs.py).
    cuda_graphs_training: with cuda_graphs, replay static training plans (forwards that save
        tensors for a backward, and those backwards) as CUDA graphs too, their outputs handed out
        from the graph's pool (FXCC_CUDA_GRAPHS_TRAINING=1, default; client/training_graphs.py).
    cuda_graphs_training_tail: a training forward's own large outputs (a language model's
        logits) are made after its graph's replay, step by step, as fresh memory rather than
        held in the graph's pool between steps (FXCC_CUDA_GRAPHS_TRAINING_TAIL=1; 0, default,
        until it has run on a GPU; client/training_graphs.py).
    pre_aot_cache: serve a plain inference graph that this machine compiled before without
        running AOTAutograd again (FXCC_PRE_AOT_CACHE=1, default; 0 always runs it;
        client/pre_aot.py). Entries live under cache_dir/pre_aot.
    dynamo_cache: a new process's first call of a compiled function runs from a saved, signed
        Dynamo package without tracing, when its guards hold (FXCC_DYNAMO_CACHE=1, default; 0
        keeps Dynamo's guards on object identity, which packages leave out; only fxcc's
        torch.compile calls get packages; client/dynamo_cache.py).
    prewarm: a plan loaded from a Dynamo package makes its first cuDNN / cuBLAS calls on a side
        thread while torch builds the package's guards (FXCC_PREWARM=1, default; 0 leaves them to
        the first call; client/prewarm.py).
    prewarm_threads: threads that make those first calls (FXCC_PREWARM_THREADS, 1 to 64, default 4):
        distinct convolutions' cuDNN plans are built on several at once.
    package_key_file: the principal's Ed25519 key that signs and checks Dynamo packages
        (FXCC_PACKAGE_KEY_FILE; None: cache_dir/keys/package.key, made on first use, mode 0600, so
        one machine's own); every client of a principal that shares packages holds the same file;
        the service never does.
    package_trusted_keys: more public keys whose packages load (FXCC_PACKAGE_TRUSTED_KEYS: keys or
        files, comma-separated; for rotating package_key_file).
    """

    url: str | None = None
    token: str | None = None
    trusted_keys: tuple[str, ...] = ()
    allow_unsigned: bool = False
    cache_dir: Path = Path.home() / ".cache" / "fxcc"
    mode: Literal["default", "max-autotune"] = "default"
    fallback: Fallback = "eager"
    blocking: bool = True
    precompile: bool = False
    cuda_graphs: bool = True
    cuda_graphs_training: bool = True
    cuda_graphs_training_tail: bool = False
    pre_aot_cache: bool = True
    dynamo_cache: bool = True
    prewarm: bool = True
    prewarm_threads: int = 4
    package_key_file: Path | None = None
    package_trusted_keys: tuple[str, ...] = ()
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
        if env.get("FXCC_TRUSTED_KEYS"):
            values["trusted_keys"] = split_keys(env["FXCC_TRUSTED_KEYS"])
        if env.get("FXCC_PACKAGE_KEY_FILE"):
            values["package_key_file"] = Path(env["FXCC_PACKAGE_KEY_FILE"])
        if env.get("FXCC_PACKAGE_TRUSTED_KEYS"):
            values["package_trusted_keys"] = split_keys(env["FXCC_PACKAGE_TRUSTED_KEYS"])
        if env.get("FXCC_CACHE_DIR"):
            values["cache_dir"] = Path(env["FXCC_CACHE_DIR"])
        if env.get("FXCC_MODE"):
            values["mode"] = env["FXCC_MODE"]
        if env.get("FXCC_FALLBACK"):
            values["fallback"] = env["FXCC_FALLBACK"]
        for name in ("blocking", "precompile", "cuda_graphs", "cuda_graphs_training", "cuda_graphs_training_tail",
                     "pre_aot_cache", "dynamo_cache", "prewarm", "allow_unsigned"):
            raw = env.get(f"FXCC_{name.upper()}")
            if raw:
                values[name] = _flag(f"FXCC_{name.upper()}", raw)
        if env.get("FXCC_PREWARM_THREADS"):
            try:
                values["prewarm_threads"] = int(env["FXCC_PREWARM_THREADS"])
            except ValueError:
                raise ValueError(f"FXCC_PREWARM_THREADS must be a whole number, not {env['FXCC_PREWARM_THREADS']!r}") from None
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
        for name in ("cache_dir", "package_key_file"):
            if values.get(name) is not None:
                values[name] = Path(values[name])
        if isinstance(values.get("package_trusted_keys"), str):
            values["package_trusted_keys"] = split_keys(values["package_trusted_keys"])
        elif "package_trusted_keys" in values:
            values["package_trusted_keys"] = tuple(values["package_trusted_keys"])
        if isinstance(values.get("trusted_keys"), str):
            values["trusted_keys"] = split_keys(values["trusted_keys"])
        elif "trusted_keys" in values:
            values["trusted_keys"] = tuple(values["trusted_keys"])
        return replace(self, **values).validated()

    def validated(self) -> ClientSettings:
        if self.mode not in ("default", "max-autotune"):
            raise ValueError(f"FXCC_MODE must be default or max-autotune, not {self.mode!r}")
        if self.fallback not in ("eager", "inductor", "error"):
            raise ValueError(f"FXCC_FALLBACK must be eager, inductor or error, not {self.fallback!r}")
        if not (isinstance(self.prewarm_threads, int) and 1 <= self.prewarm_threads <= 64):
            raise ValueError(f"FXCC_PREWARM_THREADS must be 1 to 64, not {self.prewarm_threads!r}")
        return self


# torch.compile's modes, as fxcc's settings: fxcc replays CUDA graphs by default (reduce-overhead's
# point); max-autotune tunes each kernel's configs on a GPU worker.
TORCH_MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "reduce-overhead": {"cuda_graphs": True},
    "max-autotune": {"mode": "max-autotune"},
    "max-autotune-no-cudagraphs": {"mode": "max-autotune", "cuda_graphs": False},
}


def compile_options(kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """fxcc's options from what torch.compile hands a backend: `options=` as they are, or `mode=`
    as TORCH_MODES says (torch allows one of the two); a mode fxcc does not know is a ValueError."""
    options = dict(kwargs.get("options") or {})
    mode = kwargs.get("mode")
    if mode is not None:
        if mode not in TORCH_MODES:
            raise ValueError(f"torch.compile mode {mode!r} is not one fxcc knows ({', '.join(TORCH_MODES)})")
        options = {**TORCH_MODES[mode], **options}
    return options or None


def split_keys(raw: str) -> tuple[str, ...]:
    """FXCC_TRUSTED_KEYS's entries: public keys or paths of key files, separated by commas."""
    return tuple(e.strip() for e in raw.split(",") if e.strip())


def embedded_public_key(env: dict[str, str] | None = None) -> Path:
    """Where the local `fxcc serve` (the embedded default) keeps its public key: its data dir's
    keys/signing.pub (FXCC_DATA_DIR, default ~/.cache/fxcc/service)."""
    env = dict(os.environ) if env is None else env
    data_dir = Path(env["FXCC_DATA_DIR"]).expanduser() if env.get("FXCC_DATA_DIR") else \
        Path.home() / ".cache" / "fxcc" / "service"
    return data_dir / "keys" / "signing.pub"


def _flag(name: str, raw: str) -> bool:
    v = raw.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be 0 or 1, not {raw!r}")
