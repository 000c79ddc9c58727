"""HTTP client for the fxcc service: fetch artifacts by key, submit compiles, wait on jobs."""

from __future__ import annotations

import base64
import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from fxcc.client import http_client
from fxcc.compiler_core.artifact import Artifact, manifest_from_json
from fxcc.compiler_core.bundle import BundleError, bundle_key, decode_bundle
from fxcc.compiler_core.errors import ArtifactError, FxccError
from fxcc.compiler_core.signing import PublicKey, SigningKeyError, TrustedKeys, read_public_keys
from fxcc.compiler_core.wire import CompileRequest

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("fxcc.remote")

BATCH_MAX_KEYS = 256  # keys per batch request (the service's FXCC_BATCH_MAX_KEYS defaults to 512)


class ServiceError(FxccError):
    """The service could not be reached or answered with an error."""


class NoBundles(ServiceError):
    """The service has no bundle routes (an fxcc before them): use the batch endpoint."""


class CompileFailed(FxccError):
    """The service ran the compile and it failed (the job's error is in the message)."""


class RemoteService:
    """The service, as a client talks to it. `trusted` is the keys whose signatures make an artifact
    loadable; None (only with FXCC_ALLOW_UNSIGNED=1) loads unsigned ones."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 30.0,
                 trusted: TrustedKeys | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url
        self.trusted = trusted
        # Note: a plain-HTTP service is asked through the standard library (client/http_client.py:
        # httpx and httpcore's imports cost a warm start 0.4 s on a CPU host), with no TLS context
        # and no redirects followed; an https one, or one that the environment's proxy settings
        # route through a proxy (as httpx honours them), through httpx.
        if url.startswith("http://") and not _proxied(url):
            self.http: Any = http_client.Client(url, headers, timeout_s)
        else:
            import httpx

            self.http = httpx.Client(base_url=url, headers=headers, timeout=timeout_s)

    @classmethod
    def for_settings(cls, settings: Any, timeout_s: float | None = None) -> RemoteService:
        trusted = None if settings.allow_unsigned else trusted_keys(settings)
        return cls(settings.url or "", settings.token,
                   settings.request_timeout_s if timeout_s is None else timeout_s, trusted)

    def close(self) -> None:
        self.http.close()

    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response | http_client.Response:
        try:
            return self.http.request(method, path, **kw)
        except Exception as e:
            if not _transport_error(e):
                raise
            raise ServiceError(f"service {self.url} unreachable: {type(e).__name__}: {e}") from None

    def get_artifact(self, key: str) -> Artifact | None:
        """The artifact for `key` from the shared cache, verified; None when it is not there."""
        r = self._request("GET", f"/v1/artifacts/{key}")
        if r.status_code == 404:
            return None
        _check(r)
        return self._verified(key, r.json())

    def get_artifacts(self, keys: list[str]) -> dict[str, Artifact]:
        """The artifacts of `keys` that the shared cache holds, each verified as get_artifact does,
        in as few requests as the service's batch limits allow (POST /v1/artifacts/batch): a warm
        start asks once for a whole model's graphs. Keys it lacks are absent from the answer; an
        artifact refused (signature, digest) raises ArtifactError, as get_artifact does."""
        found: dict[str, Artifact] = {}
        todo = list(dict.fromkeys(keys))
        while todo:
            batch, todo = todo[:BATCH_MAX_KEYS], todo[BATCH_MAX_KEYS:]
            sent, not_sent = self._batch(batch, found)
            if not sent and not_sent:  # the first artifact alone is over the service's byte limit
                art = self.get_artifact(not_sent[0])
                if art is not None:
                    found[not_sent[0]] = art
                not_sent = not_sent[1:]
            todo = not_sent + todo
        return found

    def _batch(self, keys: list[str], found: dict[str, Artifact]) -> tuple[int, list[str]]:
        """One batch request: adds its hits to `found`; returns how many lines were artifacts or
        misses and the keys the service left for another request."""
        import json

        asked = set(keys)
        try:
            with self.http.stream("POST", "/v1/artifacts/batch", json={"keys": keys}) as r:
                if r.status_code >= 400:
                    r.read()
                    _check(r)
                answered = 0
                for line in r.iter_lines():
                    if not line:
                        continue
                    item = json.loads(line)
                    if item.get("done"):
                        return answered, [k for k in item.get("not_sent", []) if k in asked]
                    answered += 1
                    key = item.get("key")
                    if key not in asked:
                        raise ServiceError(f"service answered key {str(key)[:12]} it was not asked for")
                    if not item.get("missing"):
                        found[key] = self._verified(key, item)
        except Exception as e:
            if not _transport_error(e):
                raise
            raise ServiceError(f"service {self.url} unreachable: {type(e).__name__}: {e}") from None
        raise ServiceError(f"service {self.url} cut a batch of {len(keys)} artifacts short")

    def _verified(self, key: str, body: dict[str, Any]) -> Artifact:
        """The artifact in a hit's answer (JSON, blobs in base64), as _checked checks it."""
        manifest = body.get("manifest")
        blobs = {d: base64.b64decode(b) for d, b in body.get("blobs", {}).items()}
        return self._checked(key, manifest, body.get("signature"), lambda: _json_bytes(manifest), blobs)

    def _checked(self, key: str, manifest: Any, signature: str | None, manifest_json: Any,
                 blobs: dict[str, bytes]) -> Artifact:
        """The artifact of `manifest` (decoded JSON; `manifest_json()` gives its bytes) and `blobs`,
        once its signature (before anything else is decoded) and every blob's digest check out."""
        if self.trusted is not None:  # before anything of the artifact is decoded, let alone loaded
            why = self.trusted.check(manifest, signature)
            if why is not None:
                raise ArtifactError(f"artifact {key[:12]} from {self.url} refused: {why}. "
                                    f"Trusted keys: {', '.join(self.trusted.ids()) or 'none'} "
                                    f"(FXCC_TRUSTED_KEYS names the workers' public keys; see fxcc keygen)")
        m = manifest_from_json(manifest_json())
        art = Artifact(m, {ref.digest: blobs[ref.digest] for ref in m.blob_refs() if ref.digest in blobs})
        if art.manifest.key != key:
            raise ArtifactError(f"service returned artifact {art.manifest.key[:12]} for key {key[:12]}")
        art.verify()
        return art

    def get_bundled(self, keys: list[str]) -> dict[str, Artifact]:
        """The artifacts of `keys` that the shared cache holds, each verified as get_artifact does,
        from bundles (routes/bundles.py): `GET /v1/bundles/{bundle_key(keys)}`, one Redis read on the
        service (or an HTTP cache's hit), and on a 404 `POST /v1/bundles`, which assembles and stores
        it for the next rank. A model larger than one bundle continues in the bundle of its `rest`.
        Raises NoBundles when the service has no bundle routes; ArtifactError for a refused one."""
        found: dict[str, Artifact] = {}
        todo = sorted(set(keys))
        while todo:
            chunk, todo = todo[:BATCH_MAX_KEYS], todo[BATCH_MAX_KEYS:]
            while chunk:
                bundle = self._bundle(chunk)
                for key, manifest_json, signature in bundle.artifacts:
                    manifest = _json_loads(manifest_json)
                    found[key] = self._checked(key, manifest, signature, lambda m=manifest_json: m, bundle.blobs)
                if len(bundle.rest) >= len(chunk):
                    raise ServiceError(f"service {self.url} answered a bundle of {len(chunk)} keys with none of them")
                chunk = bundle.rest
        return found

    def _bundle(self, keys: list[str]) -> Any:
        """The decoded bundle of `keys` (sorted): GET, then POST on a 404."""
        r = self._request("GET", f"/v1/bundles/{bundle_key(keys)}")
        if r.status_code == 404:
            r = self._request("POST", "/v1/bundles", json={"keys": keys})
            if r.status_code in (404, 405):
                raise NoBundles(f"service {self.url} has no bundles ({r.status_code})")
        _check(r)
        try:
            return decode_bundle(r.content, keys)
        except BundleError as e:
            raise ServiceError(f"service {self.url} answered a bad bundle: {e.message}") from None

    def prefetch(self, keys: list[str], cache: Any) -> int:
        """Put the artifacts of `keys` that `cache` (a LocalCache) lacks into it, from one bundle
        (or, from a service without bundles, one batch request); returns how many arrived. The
        warm-start hook: whoever knows a model's keys at once (a Dynamo package lists its graphs')
        calls this before the graphs load, so that each then hits the local cache. Never raises
        (only an optimisation).

        Note: the bundle is of the keys the cache lacks, so ranks that share a local cache (one
        machine) may ask for different bundles; ranks of a new job, with empty caches, all ask for
        the one of the whole model."""
        wanted = [k for k in dict.fromkeys(keys) if cache.get(k) is None]
        if not wanted:
            return 0
        found = self.fetch_many(wanted)
        for art in found.values():
            cache.put(art)
        return len(found)

    def fetch_many(self, keys: list[str]) -> dict[str, Artifact]:
        """The artifacts of `keys` the service holds, verified, from one bundle (or, from a service
        without bundles, one batch request); {} when that fails (said once). Never raises: whoever
        asks fetches each missing one by itself."""
        try:
            try:
                return self.get_bundled(keys)
            except NoBundles:
                return self.get_artifacts(keys)
        except Exception as e:  # noqa: BLE001 - each graph still fetches its own artifact
            _warn_once(f"fxcc: batch fetch of {len(keys)} artifacts from {self.url} failed "
                       f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); fetching one by one")
            return {}

    def get_pre_aot(self, key: str) -> dict[str, Any] | None:
        """This principal's pre-AOT entry for `key` (JSON, unchecked); None when there is none."""
        r = self._request("GET", f"/v1/pre-aot/{key}")
        if r.status_code == 404:
            return None
        _check(r)
        return r.json()

    def put_pre_aot(self, key: str, entry: dict[str, Any]) -> bool:
        """Share a pre-AOT entry under this principal; False when the service does not hold the
        artifact it names (409)."""
        r = self._request("PUT", f"/v1/pre-aot/{key}", json=entry)
        if r.status_code == 409:
            return False
        _check(r)
        return True

    def submit(self, request: CompileRequest, busy_wait_s: float = 30.0) -> dict[str, Any]:
        """POST the compile; the service answers done (cached) or queued with a job id. A 429 (this
        principal is over a quota, or has as many requests being checked as it may: capacity that
        its own jobs free) is asked again after its Retry-After, for up to `busy_wait_s`; a 503 (the
        service's store away, its queue full) falls back at once."""
        body = request.model_dump_json()
        deadline = time.monotonic() + busy_wait_s
        while True:
            r = self._request("POST", "/v1/compile", content=body, headers={"Content-Type": "application/json"})
            left = deadline - time.monotonic()
            if r.status_code != 429 or left <= 0:
                break
            pause = min(left, _retry_after(r))
            _warn_once(f"service {self.url} is busy ({r.status_code} {r.headers.get('X-Fxcc-Quota') or ''}): "
                       f"asking again after Retry-After, for up to {busy_wait_s:.0f} s")
            time.sleep(pause)
        _check(r)
        return r.json()

    def wait(self, job_id: str, timeout_s: float, progress: Progress | None = None) -> dict[str, Any]:
        """Long-poll a job until it is done or failed, or raise ServiceError after timeout_s."""
        start = time.monotonic()
        deadline = start + timeout_s
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ServiceError(f"compile job {job_id} not finished after {timeout_s:.0f} s")
                # With a progress line, poll every second so that it moves; else long-poll.
                wait = 1 if progress else max(1, min(30, int(left)))
                r = self._request("GET", f"/v1/jobs/{job_id}", params={"wait": wait},
                                  timeout=wait + self.http.timeout.read)
                _check(r)
                job = r.json()
                if progress:
                    progress.update(job, time.monotonic() - start)
                if job["state"] in ("done", "failed", "cancelled"):
                    return job
        finally:
            if progress:
                progress.close()

    def compile(self, request: CompileRequest, key: str, timeout_s: float) -> tuple[Artifact, str]:
        """The artifact for `request`: from the shared cache, or compiled by the service's workers.

        Returns the artifact and where it came from ("remote-hit" or "remote-compiled").
        """
        art = self.get_artifact(key)
        if art is not None:
            return art, "remote-hit"
        answer = self.submit(request)
        if answer.get("key") != key:
            raise ServiceError(f"service computed key {str(answer.get('key'))[:12]}, client {key[:12]}: "
                               "versions of compiler_core, torch or triton differ")
        source = "remote-hit"
        if answer["status"] != "done":
            job = self.wait(answer["job_id"], timeout_s, Progress.for_stderr(key))
            if job["state"] != "done":
                err = job.get("error") or {}
                raise CompileFailed(f"compile job {job['id']} {job['state']}: "
                                    f"{err.get('error')}: {err.get('message')}",
                                    op=err.get("op"), node=err.get("node"))
            source = "remote-compiled"
        art = self.get_artifact(key)
        if art is None:
            raise ServiceError(f"job for {key[:12]} finished but its artifact is missing")
        return art, source


class Progress:
    """One line on a terminal's stderr while a compile is awaited; nothing when stderr is not a tty."""

    def __init__(self, key: str, stream: Any) -> None:
        self.key, self.stream, self.shown = key, stream, False

    @classmethod
    def for_stderr(cls, key: str) -> Progress | None:
        return cls(key, sys.stderr) if sys.stderr.isatty() else None

    def update(self, job: dict[str, Any], elapsed_s: float) -> None:
        # Quiet for quick compiles; a line once a wait is long enough to wonder about.
        if elapsed_s < 2 and job["state"] not in ("done", "failed", "cancelled"):
            return
        stage = job.get("stage") or job["state"]
        worker = job.get("worker") or "-"
        self.stream.write(f"\rfxcc: compiling graph {self.key[:12]}: {stage} on {worker}, {elapsed_s:4.0f} s ")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()


def trusted_keys(settings: Any) -> TrustedKeys:
    """The keys named by `settings.trusted_keys`, plus the local `fxcc serve`'s own public key when
    this user's data dir holds one (the embedded default needs no setup). A key file that is not
    this user's, or that others may write, is skipped with a warning."""
    from fxcc.client.settings import embedded_public_key

    keys: list[PublicKey] = []
    for entry in settings.trusted_keys:
        keys += read_public_keys(entry)  # a bad entry raises: a typo must not silently trust nothing
    own = embedded_public_key()
    if own.is_file():
        st = own.stat()
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            _warn_once(f"fxcc: not trusting {own}: it must be owned by this user and writable by no one else")
        else:
            try:
                keys += read_public_keys(str(own))
            except SigningKeyError as e:
                _warn_once(f"fxcc: not trusting {own}: {e}")
    return TrustedKeys(keys)


_warned: set[str] = set()


def _warn_once(text: str) -> None:
    if text not in _warned:
        _warned.add(text)
        log.warning(text)


def _proxied(url: str) -> bool:
    """Whether HTTP_PROXY / ALL_PROXY (less NO_PROXY) send requests to `url` through a proxy."""
    import urllib.parse
    import urllib.request

    proxies = urllib.request.getproxies()
    if not (proxies.get("http") or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass(urllib.parse.urlsplit(url).hostname or "")


def _transport_error(e: Exception) -> bool:
    """Whether `e` is the HTTP client's own (the service unreachable, a broken answer): httpx's
    when RemoteService was given an httpx client (an https service, a test's app client)."""
    httpx = sys.modules.get("httpx")
    return isinstance(e, http_client.TransportError) or (httpx is not None and isinstance(e, httpx.HTTPError))


def _retry_after(r: httpx.Response | http_client.Response) -> float:
    """The seconds a 429/503 asks the client to wait (Retry-After, 1-30 s; 2 when it names none)."""
    try:
        return min(30.0, max(1.0, float(r.headers.get("Retry-After", "2"))))
    except ValueError:
        return 2.0


def _json_bytes(obj: Any) -> bytes:
    import json

    return json.dumps(obj).encode()


def _json_loads(data: bytes) -> Any:
    import json

    try:
        return json.loads(data)
    except ValueError as e:
        raise ArtifactError(f"malformed manifest: {e}") from None


def _check(r: httpx.Response | http_client.Response) -> None:
    if r.status_code >= 400:
        try:
            detail = r.json()
        except ValueError:
            detail = r.text[:300]
        raise ServiceError(f"service answered {r.status_code}: {detail}")
