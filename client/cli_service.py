"""`fxcc status|jobs|stats|cache`: the service's HTTP API from a shell, with --json for scripts.

Exit codes: 0 ok, 1 the service answered an error (or the job failed), 2 usage or configuration
error (no URL), 3 the service is unreachable.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import httpx

from fxcc.client.settings import ClientSettings

EXIT_ERROR, EXIT_USAGE, EXIT_UNREACHABLE = 1, 2, 3


class CliError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _call(args: argparse.Namespace, method: str, path: str, **kw: Any) -> Any:
    settings = ClientSettings.from_env()
    url = args.url or settings.url
    if not url:
        raise CliError("no service URL (set FXCC_URL or pass --url)", EXIT_USAGE)
    token = args.token or settings.token
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.request(method, f"{url.rstrip('/')}{path}", headers=headers, timeout=30, **kw)
    except httpx.HTTPError as e:
        raise CliError(f"service {url} unreachable: {e}", EXIT_UNREACHABLE) from None
    if r.status_code >= 400:
        try:
            body = r.json()
            detail = body.get("message") or body.get("detail") or body
        except ValueError:
            detail = r.text[:300]
        hint = {401: " (set FXCC_TOKEN)", 403: " (this needs an admin token)"}.get(r.status_code, "")
        raise CliError(f"{r.status_code}: {detail}{hint}", EXIT_ERROR)
    return r.json() if r.content else {}


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2) if args.json else text)


def status(args: argparse.Namespace) -> int:
    job = _call(args, "GET", f"/v1/jobs/{args.job}")
    err = job.get("error") or {}
    text = (f"{job['id']}  {job['state']}  key={job['key'][:12]}  worker={job.get('worker') or '-'}"
            + (f"\n  error: {err.get('error')}: {err.get('message')}" if err else ""))
    _emit(args, job, text)
    return EXIT_ERROR if job["state"] == "failed" else 0


def jobs(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"limit": args.limit}
    if args.state:
        params["state"] = args.state
    body = _call(args, "GET", "/v1/jobs", params=params)
    rows = body.get("jobs", body) if isinstance(body, dict) else body
    # `by`: the principals attached to the job (a client's listing holds only its own jobs; an admin's all)
    lines = [f"{'id':34} {'state':10} {'kind':12} {'key':14} {'worker':20} by"]
    lines += [f"{j['id']:34} {j['state']:10} {_job_kind(j):12} {j['key'][:12]:14} {j.get('worker') or '-':20} "
              f"{','.join(j.get('principals') or []) or '-'}" for j in rows]
    _emit(args, rows, "\n".join(lines))
    return 0


def _job_kind(job: dict[str, Any]) -> str:
    """A compile job's priority (interactive / precompile), or `tune sm_90` for a tune job."""
    if job.get("kind") == "tune":
        return f"tune sm_{job.get('arch')}"
    return str(job.get("priority", ""))


def stats(args: argparse.Namespace) -> int:
    body = _call(args, "GET", "/v1/stats")
    _emit(args, body, "\n".join(f"{k:18} {json.dumps(v)}" for k, v in body.items()))
    return 0


def cache(args: argparse.Namespace) -> int:
    if args.action == "ls":
        body = _call(args, "GET", "/v1/cache")
        entries = body.get("entries", body) if isinstance(body, dict) else body
        text = "\n".join(f"{e.get('key', e)}" if not isinstance(e, dict) else
                         f"{e['key']}  {e.get('bytes', '')}" for e in entries)
        _emit(args, body, text or "(empty)")
    elif args.action == "rm":
        if not args.keys:
            raise CliError("cache rm needs one or more keys", EXIT_USAGE)
        removed = [_call(args, "DELETE", f"/v1/cache/{k}") for k in args.keys]
        _emit(args, removed, f"removed {len(removed)} entr{'y' if len(removed) == 1 else 'ies'}")
    else:
        if not args.yes:
            raise CliError("cache purge deletes every artifact of the cluster: pass --yes", EXIT_USAGE)
        body = _call(args, "DELETE", "/v1/cache")
        _emit(args, body, f"purged: {body}")
    return 0


def add_parsers(sub: Any) -> None:
    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--url", default=None, help="service URL (default FXCC_URL)")
        p.add_argument("--token", default=None, help="bearer token (default FXCC_TOKEN)")
        p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("status", help="show a compile job")
    p.add_argument("job")
    common(p)
    p.set_defaults(fn=_guard(status))

    p = sub.add_parser("jobs", help="recent compile jobs")
    p.add_argument("--state", choices=["queued", "running", "done", "failed", "cancelled"])
    p.add_argument("--limit", type=int, default=20)
    common(p)
    p.set_defaults(fn=_guard(jobs))

    p = sub.add_parser("stats", help="queue depth, workers, cache size and hit rate")
    common(p)
    p.set_defaults(fn=_guard(stats))

    p = sub.add_parser("cache", help="list, remove or purge artifacts in the shared cache (admin)")
    p.add_argument("action", choices=["ls", "rm", "purge"])
    p.add_argument("keys", nargs="*")
    p.add_argument("--yes", action="store_true", help="confirm purge")
    common(p)
    p.set_defaults(fn=_guard(cache))


def _guard(fn: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except CliError as e:
            print(f"fxcc {args.command}: {e}", file=sys.stderr)
            return e.code
    return run
