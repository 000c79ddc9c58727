"""Replays the attacks of issue 17 ("hostile clients and a hostile cache") against a real stack and says
what each one gets. Not a test (the tests in tests/service, tests/worker and tests/e2e assert each point);
this is the evidence an operator can rerun.

`TRITON_INTERPRET=1 python -m bench.attacks [--fan 2000] [--out FILE]` starts its own redis-server (from
PATH, on a free port, in a temporary directory), `fxcc serve` on it with an admin token, one
`fxcc worker` with a signing key made for the run, and a second `fxcc serve` in its embedded default. A
thread polls GET /healthz every 0.2 s throughout and the last line says how slow the slowest answer
was and whether any was not 200. One JSON line per attack.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import redis

from bench.compile_scaling import fan_graph
from fxcc.client.demo import free_port, wait_healthy
from fxcc.compiler_core.signing import PublicKey, TrustedKeys, write_key_pair
from fxcc.compiler_core.wire import CompileRequest, GraphSpec, ListArg, Node, NodeRef, Placeholder, TensorSpec

ADMIN = "attacks-admin-token"
JSON = {"Content-Type": "application/json"}
HTTP = httpx.Client(timeout=120)


def unary(n: int = 4, target: str = "aten.sin.default") -> CompileRequest:
    spec = TensorSpec(dtype="float32", sizes=[n, 8], strides=[8, 1])
    return CompileRequest(graph=GraphSpec(placeholders=[Placeholder(name="x", spec=spec)],
                                          nodes=[Node(name="y", target=target, args=[NodeRef(name="x")])],
                                          outputs=[NodeRef(name="y")]))


def strided(stride: str) -> str:
    x = {"name": "x", "spec": {"dtype": "float32", "sizes": ["s0", 4], "strides": [stride, 1]}}
    return json.dumps({"graph": {"symbols": [{"name": "s0"}], "placeholders": [x],
                                 "nodes": [{"name": "y", "target": "aten.sin.default",
                                            "args": [{"kind": "node", "name": "x"}]}],
                                 "outputs": [{"kind": "node", "name": "y"}]}})


class Prober(threading.Thread):
    """GET /healthz every 0.2 s: the slowest answer and every answer that was not a 200."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.stop, self.worst_s, self.bad = url, threading.Event(), 0.0, []
        self.phase_worst_s, self.phase_bad = 0.0, []

    def run(self) -> None:
        with httpx.Client(timeout=10) as c:
            while not self.stop.wait(0.2):
                t0 = time.monotonic()
                try:
                    status = c.get(f"{self.url}/healthz").status_code
                except httpx.HTTPError as e:
                    status = type(e).__name__
                took = time.monotonic() - t0
                self.worst_s, self.phase_worst_s = max(self.worst_s, took), max(self.phase_worst_s, took)
                if status != 200:
                    self.bad.append(status)
                    self.phase_bad.append(status)


def wait_job(url: str, job_id: str, headers: dict, want: tuple[str, ...] = ("done", "failed", "cancelled"),
             timeout_s: float = 600) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        job = HTTP.get(f"{url}/v1/jobs/{job_id}", params={"wait": 5}, headers=headers).json()
        if job["state"] in want or time.monotonic() > deadline:
            return job


PROBER: Prober | None = None


def report(rows: list[dict], attack: str, **got: Any) -> None:
    """One attack's line, with the slowest health answer and the non-200s since the previous line."""
    row = {"attack": attack, **got}
    if PROBER is not None:
        row.update(health_slowest_s=round(PROBER.phase_worst_s, 3), health_not_200=PROBER.phase_bad[:5])
        PROBER.phase_worst_s, PROBER.phase_bad = 0.0, []
    rows.append(row)
    print(json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fan", type=int, nargs="+", default=[500, 2000, 8000], help="fan graph widths")
    parser.add_argument("--out", default=None, help="also write the JSON lines here")
    args = parser.parse_args()
    exe = shutil.which("redis-server")
    if exe is None:
        sys.exit("bench.attacks needs redis-server on PATH")
    tmp = Path(tempfile.mkdtemp(prefix="fxcc-attacks-"))
    rport, port, eport = free_port(), free_port(), free_port()
    rurl = f"redis://127.0.0.1:{rport}/0"

    def start_redis() -> subprocess.Popen:
        p = subprocess.Popen([exe, "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                              "--dir", str(tmp)], stdout=subprocess.DEVNULL)
        for _ in range(100):
            try:
                redis.Redis.from_url(rurl).ping()
                return p
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    procs: dict[str, subprocess.Popen] = {"redis": start_redis()}
    key_file = tmp / "worker.key"
    write_key_pair(key_file, tmp / "worker.key.pub")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
    env.update(TRITON_INTERPRET="1", FXCC_REDIS_URL=rurl, FXCC_TOKEN=ADMIN, FXCC_DATA_DIR=str(tmp / "data"),
               FXCC_CLAIM_BLOCK_MS="200", FXCC_SIGNING_KEY_FILE=str(key_file), FXCC_JOB_TIMEOUT_S="120")
    cli = [sys.executable, "-m", "fxcc.client.cli"]

    def spawn(name: str, argv: list[str], e: dict[str, str]) -> None:
        procs[name] = subprocess.Popen(cli + argv, env=e, stdout=(tmp / f"{name}.log").open("w"),
                                       stderr=subprocess.STDOUT)

    spawn("serve", ["serve", "--port", str(port)], env)
    spawn("worker", ["worker", "--device", "cpu"], env)
    url = f"http://127.0.0.1:{port}"
    rows: list[dict] = []
    global PROBER
    prober = PROBER = Prober(url)
    try:
        wait_healthy(url, procs["serve"])
        prober.start()
        admin = {"Authorization": f"Bearer {ADMIN}", **JSON}
        tok = {n: {"Authorization": "Bearer " + HTTP.post(f"{url}/v1/admin/tokens", json={"name": n},
                                                            headers=admin).json()["token"], **JSON}
               for n in ("alice", "bob")}

        # 1. Size expressions that froze the API process, one and forty at once.
        for expr in ("pow(s0, 9223372036854775807)", "pow(3, 100000000)"):
            t0 = time.monotonic()
            r = HTTP.post(f"{url}/v1/compile", content=strided(expr), headers=tok["alice"])
            report(rows, f"stride {expr}", status=r.status_code, seconds=round(time.monotonic() - t0, 3),
                   message=r.json().get("message", "")[:160])
        t0 = time.monotonic()
        threads, codes = [], []
        for _ in range(40):
            th = threading.Thread(target=lambda: codes.append(HTTP.post(
                f"{url}/v1/compile", content=strided("pow(s0, 9223372036854775807)"), headers=tok["bob"]).status_code))
            th.start()
            threads.append(th)
        for th in threads:
            th.join()
        report(rows, "40 pow strides at once", statuses=sorted(set(codes)), seconds=round(time.monotonic() - t0, 3))

        # 2. Ops with side effects.
        bad = json.loads(strided("4"))
        bad["graph"]["nodes"] = [{"name": "y", "target": "aten.from_file.default",
                                  "args": [{"kind": "str", "value": "etc-passwd"}, {"kind": "bool", "value": False},
                                           {"kind": "int", "value": 16}]}]
        r = HTTP.post(f"{url}/v1/compile", content=json.dumps(bad), headers=tok["alice"])
        report(rows, "aten.from_file", status=r.status_code, message=r.json().get("message", "")[:160])

        # 3. Principals: alice's job, seen and touched by bob.
        a = HTTP.post(f"{url}/v1/compile", content=unary(5).model_dump_json(), headers=tok["alice"]).json()
        job = wait_job(url, a["job_id"], tok["alice"])
        listed = [j["id"] for j in HTTP.get(f"{url}/v1/jobs", headers=tok["bob"]).json()]
        report(rows, "bob lists, reads and deletes alice's job", alice_job=job["state"],
               bob_lists_it=a["job_id"] in listed,
               bob_get=HTTP.get(f"{url}/v1/jobs/{a['job_id']}", headers=tok["bob"]).status_code,
               bob_delete=HTTP.delete(f"{url}/v1/jobs/{a['job_id']}", headers=tok["bob"]).status_code,
               bob_get_artifact_by_key=HTTP.get(f"{url}/v1/artifacts/{a['key']}", headers=tok["bob"]).status_code)

        # 4. A forged manifest in the cache Redis: an edited Triton source and a manifest listing it.
        r = redis.Redis.from_url(rurl)
        mkey = f"fxcc:manifest:{a['key']}"
        manifest = json.loads(r.get(mkey))
        ref = manifest["kernels"][0]["source"]
        evil = b"import os; os.system('touch /tmp/fxcc-pwned')\n" + r.get(f"fxcc:blob:{ref['digest']}")
        ref.update(digest=hashlib.sha256(evil).hexdigest(), size=len(evil))
        r.set(f"fxcc:blob:{ref['digest']}", evil)
        r.set(mkey, json.dumps(manifest))
        body = HTTP.get(f"{url}/v1/artifacts/{a['key']}", headers=tok["bob"]).json()
        trusted = TrustedKeys([PublicKey((tmp / "worker.key.pub").read_text())])
        report(rows, "forged manifest, edited source blob", client_check=trusted.check(body["manifest"],
                                                                                        body["signature"]))
        r.delete(f"fxcc:sig:{a['key']}")
        body = HTTP.get(f"{url}/v1/artifacts/{a['key']}", headers=tok["bob"]).json()
        report(rows, "forged manifest, signature removed", client_check=trusted.check(body["manifest"],
                                                                                       body["signature"]))

        # 5. Wide fan graphs: compile time per width (the job's own stats), health meanwhile.
        for n in args.fan:
            req = CompileRequest(graph=fan_graph(n)).model_dump_json()
            t0 = time.monotonic()
            sub = HTTP.post(f"{url}/v1/compile", content=req, headers=tok["alice"])
            job = wait_job(url, sub.json()["job_id"], tok["alice"]) if sub.status_code == 202 else sub.json()
            report(rows, f"fan graph n={n}", submit=sub.status_code, state=job.get("state"),
                   seconds=round(time.monotonic() - t0, 2), error=(job.get("error") or {}).get("error"))

        # 6. A 30-MB request: what a poll costs while it waits, and what stays in Redis once it ended.
        n, width = 1400, 720  # 1400 nodes cat([x] * 720): about 30 MB of JSON
        big = CompileRequest(graph=GraphSpec(
            placeholders=[Placeholder(name="x", spec=TensorSpec(dtype="float32", sizes=[4, 8], strides=[8, 1]))],
            nodes=[Node(name=f"c{i}", target="aten.cat.default", args=[ListArg(items=[NodeRef(name="x")] * width)])
                   for i in range(n)],
            outputs=[NodeRef(name=f"c{n - 1}")])).model_dump_json()
        sub = HTTP.post(f"{url}/v1/compile", content=big, headers=tok["alice"])
        got: dict[str, Any] = {"bytes": len(big), "submit": sub.status_code}
        if sub.status_code == 202:
            jid = sub.json()["job_id"]
            t0 = time.monotonic()
            for _ in range(10):
                HTTP.get(f"{url}/v1/jobs/{jid}", headers=tok["alice"])
            got["poll_ms"] = round(100 * (time.monotonic() - t0), 1)
            job = wait_job(url, jid, tok["alice"])
            got.update(state=job["state"], redis_bytes_left=sum(r.memory_usage(k) or 0 for k in r.scan_iter(
                match=f"fxcc:*{jid}*")))
        else:
            got["message"] = sub.text[:160]
        report(rows, "30-MB request", **got)

        # 7. One principal fills the queue: alice until refused, then bob.
        procs["worker"].terminate()
        procs["worker"].wait(60)
        statuses = []
        for i in range(3000):
            s = HTTP.post(f"{url}/v1/compile", content=unary(100 + i).model_dump_json(), headers=tok["alice"])
            statuses.append(s.status_code)
            if s.status_code != 202:
                break
        b = HTTP.post(f"{url}/v1/compile", content=unary(99).model_dump_json(), headers=tok["bob"])
        report(rows, "alice floods the queue", alice_accepted=statuses.count(202), alice_then=statuses[-1],
               retry_after=s.headers.get("retry-after"), bob=b.status_code)

        # 8. Redis restarts while no worker is alive.
        procs["redis"].terminate()
        procs["redis"].wait(30)
        procs["redis"] = start_redis()
        answers = {}
        for path in ("/v1/status", "/v1/stats", "/metrics"):
            a_ = HTTP.get(f"{url}{path}", headers=admin)
            answers[path] = [a_.status_code, a_.headers.get("retry-after")]
        report(rows, "redis restarted, no worker", **answers)

        # 9. The embedded default: a foreign Host, anonymous token minting.
        eenv = {k: v for k, v in env.items() if k not in ("FXCC_REDIS_URL", "FXCC_TOKEN", "FXCC_SIGNING_KEY_FILE")}
        eenv["FXCC_DATA_DIR"] = str(tmp / "embedded")
        spawn("embedded", ["serve", "--port", str(eport)], eenv)
        eurl = f"http://127.0.0.1:{eport}"
        wait_healthy(eurl, procs["embedded"])
        report(rows, "embedded: Host evil.example", status=HTTP.get(f"{eurl}/v1/status",
                                                                     headers={"Host": "evil.example"}).status_code)
        r2 = HTTP.post(f"{eurl}/v1/admin/tokens", json={"name": "x", "role": "admin"})
        report(rows, "embedded: anonymous POST /v1/admin/tokens", status=r2.status_code,
               tokens_on_disk=sorted(p.name for p in (tmp / "embedded").rglob("*token*")))
        r3 = HTTP.post(f"{eurl}/v1/compile", content=unary().model_dump_json(),
                       headers={**JSON, "Origin": "http://evil.example"})
        report(rows, "embedded: cross-origin POST /v1/compile", status=r3.status_code)
    finally:
        prober.stop.set()
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        PROBER = None
        report(rows, "health throughout", slowest_s=round(prober.worst_s, 3), not_200=prober.bad[:10])
        if args.out:
            Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
