"""fxcc installs as one import namespace, `fxcc`, beside anyone's code; `pip install fxcc` is the client.

The top-level folders (client/, compiler_core/, service/, worker/) are fxcc's subpackages, mapped by
pyproject.toml's package-dir. The wheel test builds the wheel from a copy of this tree, installs it
without extras into a fresh virtualenv beside a user project that has its own `client`, `service` and
`worker` packages, and compiles from that project.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {"fxcc": "fxcc", "fxcc.client": "client", "fxcc.compiler_core": "compiler_core",
           "fxcc.service": "service", "fxcc.worker": "worker"}
OLD_ROOTS = {"client", "compiler_core", "service", "worker"}
SERVER_STACK = ("fastapi", "uvicorn", "redis", "starlette", "pydantic_settings")


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_every_subpackage_of_the_tree_is_in_the_package_list() -> None:
    setup = _pyproject()["tool"]["setuptools"]
    assert setup["package-dir"] == FOLDERS
    found = set()
    for name, folder in FOLDERS.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder)
            found.add(".".join([name, *rel.parts]))
    assert sorted(found) == sorted(setup["packages"])


def _python_files() -> list[Path]:
    skip = {".venv", ".git", "build", ".fxcc-demo", "node_modules"}
    return [p for p in REPO.rglob("*.py") if not skip & set(p.relative_to(REPO).parts)]


OLD_IMPORT = re.compile(r"(?:^|;|[\"'])\s*(?:from|import) (?:client|compiler_core|service|worker)\b(?![\w-])"
                        r"|[\"']-m[\"'],\s*[\"'](?:client|compiler_core|service|worker)\b")


def test_no_module_imports_the_old_top_level_names() -> None:
    """Imports, `python -m` paths and child-process code say `fxcc.<part>`: a bare `client` would find
    a user's package of that name, or this tree's folder loaded a second time."""
    offenders = []
    for path in _python_files():
        if path == Path(__file__).resolve():  # the user project's script below imports its own `client`
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if OLD_IMPORT.search(line):
                offenders.append(f"{path.relative_to(REPO)}:{lineno}: {line.strip()}")
    assert not offenders, offenders


def test_import_fxcc_is_the_public_api_without_the_server_stack_or_inductor() -> None:
    code = textwrap.dedent("""
        import importlib.metadata, json, sys
        import fxcc
        light = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "fastapi", "redis", "uvicorn"))
        settings = fxcc.ClientSettings.from_env({"FXCC_URL": "http://svc:1/"})
        explain = fxcc.explain
        heavy = sorted(m for m in sys.modules
                       if m.split(".")[0] in ("fastapi", "redis", "uvicorn", "starlette", "pydantic_settings")
                       or m.startswith("torch._inductor"))
        print(json.dumps({"version": fxcc.__version__, "dist": importlib.metadata.version("fxcc"),
                          "light": light, "url": settings.url, "explain": explain.__module__, "heavy": heavy}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    got = json.loads(out.stdout)
    assert got["version"] == got["dist"]
    assert got["light"] == []  # `import fxcc` alone imports neither torch nor the server stack
    assert got["url"] == "http://svc:1" and got["explain"] == "fxcc.client.explain"
    assert got["heavy"] == []


USER_PACKAGES = {
    # The user's own packages, named like fxcc's folders; each records who it is.
    "client/__init__.py": "WHO = 'user client'\n",
    "client/backend.py": "WHO = 'user client.backend'\n",
    "service/__init__.py": "WHO = 'user service'\n",
    "worker/__init__.py": "WHO = 'user worker'\n",
}

USER_SCRIPT = """
import importlib.metadata, importlib.util, json, sys
import client, client.backend, service, worker   # the user's packages, imported first
import torch

def f(x, y):
    return torch.sin(x) * y + torch.cos(y).sum()

x, y = torch.randn(257), torch.randn(257)
out = torch.compile(f, backend="fxcc")(x, y)
expected = f(x, y)

from fxcc.client import backend as fxcc_backend

def installed(dist):
    try:
        importlib.metadata.distribution(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False

print(json.dumps({
    "max_err": (out - expected).abs().max().item(),
    "events": [e.source for e in fxcc_backend.events()],
    "who": [client.WHO, client.backend.WHO, service.WHO, worker.WHO],
    "files": [m.__file__ for m in (client, client.backend, service, worker)],
    "fxcc_file": fxcc_backend.__file__,
    "imported": sorted(m for m in sys.modules if m.split(".")[0] in SERVER_STACK),
    "findable": [m for m in SERVER_STACK if importlib.util.find_spec(m) is not None],
    "installed": [d for d in ("fastapi", "uvicorn", "redis", "pydantic-settings") if installed(d)],
}))
""".replace("SERVER_STACK", repr(SERVER_STACK))


def _build_wheel(tmp: Path) -> Path:
    """The wheel of a copy of this tree (a build/ folder left here must not leak into it)."""
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "*.egg-info", "__pycache__", ".fxcc-demo", ".pytest_cache", "tests", "bench"))
    dist = tmp / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(src)],
                   check=True, timeout=600, capture_output=True)
    (wheel,) = dist.glob("fxcc-*.whl")
    return wheel


def test_wheel_installs_alone_beside_a_user_project_and_compiles(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    version = _declared_version()
    assert {n.split("/")[0] for n in names} == {"fxcc", f"fxcc-{version}.dist-info"}
    assert "fxcc/service/static/dashboard.html" in names and "fxcc/client/backend.py" in names
    entry_points = zipfile.ZipFile(wheel).read(f"fxcc-{version}.dist-info/entry_points.txt").decode()
    assert "fxcc = fxcc.client.cli:main" in entry_points
    assert "fxcc = fxcc.client.backend:fxcc_backend" in entry_points

    # What pip takes from the user's environment instead of installing: it must be what the wheel asks for.
    metadata = zipfile.ZipFile(wheel).read(f"fxcc-{version}.dist-info/METADATA").decode()
    required = {_dist_name(line.split(":", 1)[1]) for line in metadata.splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line}
    assert set(USERS_DISTS) <= required, required

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py, env = venv / "bin" / "python", {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # The user's torch, Triton and NumPy, already installed: this one's, linked (copying torch's 0.9 GB
    # took the suite minutes; pip downloading and unpacking Triton's 286-MB wheel, 15 s).
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "users-torch.pth").write_text(f"{_linked_with_requirements(USERS_DISTS, tmp_path / 'users-torch')}\n")
    pip = [str(py), "-m", "pip", "install", "-q"]
    torch_pin = f"torch=={_installed_version('torch')}"  # satisfied by the linked one: pip keeps it
    subprocess.run([*pip, str(wheel), torch_pin], check=True, timeout=900, env=env, capture_output=True)

    project = tmp_path / "project"
    for rel, text in USER_PACKAGES.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text(text)
    (project / "train.py").write_text(USER_SCRIPT)
    run_env = {**env, "FXCC_FALLBACK": "error", "FXCC_CACHE_DIR": str(tmp_path / "cache"),
               "TRITON_INTERPRET": "1", "FXCC_URL": ""}
    run = subprocess.run([str(py), "train.py"], cwd=project, env=run_env, capture_output=True, text=True,
                         timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-4000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["max_err"] < 1e-4 and got["events"] == ["compiled-in-process"], got
    assert got["who"] == ["user client", "user client.backend", "user service", "user worker"]
    assert all(Path(f).is_relative_to(project) for f in got["files"]), got["files"]
    assert Path(got["fxcc_file"]).is_relative_to(venv), got["fxcc_file"]
    assert got["imported"] == [] and got["findable"] == [] and got["installed"] == [], got

    # The server commands name the extra they need and exit with 2, from the project too.
    for cmd in ([str(venv / "bin" / "fxcc"), "serve"], [str(venv / "bin" / "fxcc"), "worker"],
                [str(py), "-m", "fxcc.worker"]):
        r = subprocess.run(cmd, cwd=project, env=run_env, capture_output=True, text=True, timeout=120,
                           check=False)
        extra = "service" if cmd[-1] == "serve" else "worker"
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and f"pip install 'fxcc[{extra}]'" in lines[0], r.stderr


def _declared_version() -> str:
    text = (REPO / "fxcc" / "version.py").read_text()
    match = re.search(r'^__version__ = "([^"]+)"$', text, re.MULTILINE)
    assert match, "fxcc/version.py must assign __version__ a literal (pyproject reads it)"
    return match[1]


# The distributions the user's environment already has (torch's requirements come with it).
USERS_DISTS = ("torch", "triton", "numpy")


def _dist_name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"\s*([A-Za-z0-9._-]+)", requirement)[1]).lower()


def _linked_with_requirements(dists: tuple[str, ...], folder: Path) -> Path:
    """`folder`, holding links to `dists`' installed files and those of what they require here
    (without extras or requirements for other platforms), less what a fresh virtualenv has of its
    own (pip, setuptools)."""
    import importlib.metadata

    from packaging.requirements import Requirement

    folder.mkdir()
    todo, seen = list(dists), {"pip", "setuptools"}
    while todo:
        name = _dist_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        found = importlib.metadata.distribution(name)
        for top in {f.parts[0] for f in found.files or [] if f.parts[0] not in ("..", "__pycache__")}:
            if not (folder / top).exists():
                (folder / top).symlink_to(found.locate_file(top))
        for text in found.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return folder


def _installed_version(dist: str) -> str:
    import importlib.metadata

    return importlib.metadata.version(dist)


@pytest.mark.parametrize("dockerfile,extra", [("Dockerfile.api", "service"), ("Dockerfile.worker", "worker")])
def test_images_install_the_extra_they_run(dockerfile: str, extra: str) -> None:
    text = (REPO / "deploy" / dockerfile).read_text()
    assert f"pip install '.[{extra}]'" in text
    for folder in FOLDERS.values():
        assert f"COPY {folder} {folder}" in text
