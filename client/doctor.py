"""`fxcc doctor`: versions, GPU, service reachability and auth, Redis, cache dir — each a check."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import tempfile
from typing import Any

from fxcc import extras
from fxcc.client.settings import ClientSettings


def _signatures(settings: ClientSettings) -> tuple[bool | str, str]:
    """Whether artifacts from the service can be checked: a warning for the opt-out, a failure
    when no key is trusted (every artifact would be refused)."""
    if settings.allow_unsigned:
        return "warn", ("FXCC_ALLOW_UNSIGNED=1: artifacts from the service load unchecked; whoever "
                      "can write its cache runs code in this process")
    from fxcc.client.remote import trusted_keys
    from fxcc.compiler_core.errors import FxccError

    try:
        keys = trusted_keys(settings)
    except FxccError as e:
        return False, f"FXCC_TRUSTED_KEYS: {e}"
    if not keys:
        return False, ("no trusted key: every artifact from the service is refused; set FXCC_TRUSTED_KEYS to "
                       "the workers' public key (fxcc keygen)")
    return True, f"artifacts must be signed by one of {len(keys)} trusted key(s): {', '.join(keys.ids())}"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def checks(settings: ClientSettings) -> list[dict[str, Any]]:
    """Each check: name, ok (True/False/None for 'not applicable', "warn" for a risky setting), detail."""
    from fxcc.compiler_core.keys import compiler_fingerprint

    out: list[dict[str, Any]] = []

    def add(name: str, ok: bool | str | None, detail: str) -> None:
        out.append({"name": name, "ok": ok, "detail": detail})

    add("python", True, platform.python_version())
    add("compiler_core", True, compiler_fingerprint())
    for extra in extras.EXTRAS:
        absent = extras.missing(extra)
        add(f"extra {extra}", None if absent else True,
            f"not installed (pip install 'fxcc[{extra}]' to run fxcc {extra}): missing {', '.join(absent)}"
            if absent else "installed")
    for dist, minimum in (("torch", (2, 11)), ("triton", (3, 6))):
        v = _version(dist)
        ok = v is not None and tuple(int(p) for p in v.split("+")[0].split(".")[:2]) >= minimum
        add(dist, ok, v or "not installed")
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        driver = None
        try:
            from cuda.bindings import driver as cu

            err, version = cu.cuDriverGetVersion()
            driver = f"{version // 1000}.{version % 1000 // 10}" if int(err) == 0 else None
        except ImportError:
            pass
        add("gpu", True, f"{torch.cuda.get_device_name()} sm_{major}{minor}, CUDA {torch.version.cuda}, "
                         f"driver {driver or 'unknown'}")
    else:
        add("gpu", None, "none (kernels run in Triton's CPU interpreter for CPU tensors)")
    if settings.url:
        import httpx

        headers = {"Authorization": f"Bearer {settings.token}"} if settings.token else {}
        try:
            health = httpx.get(f"{settings.url}/healthz", timeout=5)
            add("service", health.status_code == 200, f"{settings.url}: {health.status_code} {health.text[:120]}")
            auth = httpx.get(f"{settings.url}/v1/status", headers=headers, timeout=5)
            add("service auth", auth.status_code == 200,
                "token accepted" if auth.status_code == 200 else f"{auth.status_code} {auth.text[:120]}")
        except httpx.HTTPError as e:
            add("service", False, f"{settings.url} unreachable: {e}")
        add("signatures", *_signatures(settings))
    else:
        add("service", None, "FXCC_URL unset: graphs compile in-process")
    redis_url = os.environ.get("FXCC_REDIS_URL")
    if redis_url:
        try:
            import redis

            redis.Redis.from_url(redis_url, socket_timeout=3).ping()
            add("redis", True, "reachable")
        except Exception as e:  # noqa: BLE001 - any failure is the finding
            add("redis", False, f"{type(e).__name__}: {e}")
    try:
        settings.cache_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=settings.cache_dir):
            pass
        add("cache dir", True, f"{settings.cache_dir} writable")
    except OSError as e:
        add("cache dir", False, f"{settings.cache_dir}: {e}")
    return out


def doctor(args: argparse.Namespace) -> int:
    results = checks(ClientSettings.from_env())
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        mark = {True: "ok  ", False: "FAIL", None: "--  ", "warn": "WARN"}
        for c in results:
            print(f"{mark[c['ok']]} {c['name']:14} {c['detail']}")
    return 1 if any(c["ok"] is False for c in results) else 0
