"""The project's own service image (``deploy/Containerfile``), built where no registry answers.

On Podman without a registry (this project's CI) the Containerfile's ``BASE`` is a Python image
assembled from this machine's own Python, like the JDK and PostgreSQL images of
:mod:`outbox.testing.images`, and every wheel is fetched beforehand into the build context's
``build/wheels`` (pinned by ``constraints.txt``), so the build itself reaches nothing. On Docker
the official ``python:3.11-slim`` base is used. Images are tagged with a digest of what they are
built from and built once.

``python -m outbox.testing.service_image`` (``make image``) builds it and prints its name.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import sysconfig
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from outbox.testing.engine import Engine
from outbox.testing.images import APPLETS, _base, _build_wanted, _digest, _ensure, _podman
from outbox.testing.service import ServiceStartError
from outbox.testing.settings import HarnessSettings

LOCAL_PYTHON_IMAGE = "localhost/outbox-python"
SERVICE_IMAGE = "localhost/kafka-outbox"
OFFICIAL_BASE = "docker.io/library/python:3.11-slim"
DEFAULT_EXTRAS = "services,postgres"
#: What the build context holds (besides build/wheels); .dockerignore allows the same.
CONTEXT = (
    "pyproject.toml",
    "constraints.txt",
    "README.md",
    "outbox",
    "relay",
    "checker",
    "outbox_cli",
    "deploy/Containerfile",
    ".dockerignore",
)
PYTHON_APPLETS = (*APPLETS, "chown", "chmod", "cp", "mv", "ln", "wget", "head", "tail", "touch")
#: glibc parts the dependency wheels need beyond Python's own closure (they bundle the rest).
GLIBC_EXTRA = (
    "libdl.so.2",
    "libpthread.so.0",
    "librt.so.1",
    "libresolv.so.2",
    "libz.so.1",
    "libutil.so.1",
    "libgcc_s.so.1",
)
LIBDIR = Path("/lib/x86_64-linux-gnu")
#: Parts of the standard library a service never uses (and that pull in X11 or tests).
SKIP = (
    "test",
    "site-packages",
    "idlelib",
    "tkinter",
    "turtledemo",
    "lib2to3",
    "ensurepip",
    "_tkinter*",
    "_test*",
    "xxlimited*",
    "_ctypes_test*",
    "_xxtestfuzz*",
    "config-3*",
)


@dataclass(frozen=True)
class BuiltImage:
    name: str
    base: str
    seconds: float
    cached: bool


def python_image(settings: HarnessSettings) -> str:
    """A Python image made of this machine's own interpreter, at ``/usr/local`` like the
    official one, with pip, busybox as ``/bin/sh`` and the shared libraries it needs."""
    prefix = Path(sys.base_prefix)
    version = ".".join(map(str, sys.version_info[:3]))
    recipe = f"{prefix} {version} {PYTHON_APPLETS} {GLIBC_EXTRA} {SKIP}"
    name = f"{LOCAL_PYTHON_IMAGE}:{version}-{_digest(recipe)}"
    changes = ("ENV PATH=/usr/local/bin:/usr/bin:/bin", "ENV LANG=C.UTF-8", 'CMD ["python3"]')
    return _ensure(name, settings, lambda root: _python_root(root, prefix), changes)


def _python_root(root: Path, prefix: Path) -> None:
    major_minor = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    local = root / "usr" / "local"
    (local / "bin").mkdir(parents=True)
    shutil.copy2(prefix / "bin" / major_minor, local / "bin" / major_minor)
    for alias in ("python3", "python"):
        (local / "bin" / alias).symlink_to(major_minor)
    stdlib = local / "lib" / major_minor
    shutil.copytree(prefix / "lib" / major_minor, stdlib, ignore=shutil.ignore_patterns(*SKIP))
    site = Path(sysconfig.get_paths(vars={"base": str(prefix)})["purelib"])
    for pip in site.glob("pip*"):
        shutil.copytree(pip, stdlib / "site-packages" / pip.name)
    libpython = prefix / "lib" / str(sysconfig.get_config_var("INSTSONAME"))
    libs = root / LIBDIR.relative_to("/")
    libs.mkdir(parents=True)
    if libpython.is_file():  # a shared build: put it where the loader looks without ld.so.cache
        shutil.copy2(libpython, libs / libpython.name)
    binaries = [local / "bin" / major_minor, *(stdlib / "lib-dynload").glob("*.so")]
    if libpython.is_file():
        binaries.append(libpython)
    binaries += [LIBDIR / lib for lib in GLIBC_EXTRA if (LIBDIR / lib).exists()]
    _base(root, binaries, '#!/bin/sh\nexec python3 "$@"\n', PYTHON_APPLETS)
    # ldd found libpython through the binary's RUNPATH (the build prefix): one copy is enough.
    shutil.rmtree(root / prefix.relative_to("/"), ignore_errors=True)
    for lib in GLIBC_EXTRA:
        if (LIBDIR / lib).exists() and not (libs / lib).exists():
            shutil.copy2((LIBDIR / lib).resolve(), libs / lib)
    (root / "etc" / "nsswitch.conf").write_text("hosts: files dns\n")


def build_service_image(
    settings: HarnessSettings,
    engine: Engine,
    checkout: Path,
    *,
    extras: str = DEFAULT_EXTRAS,
    log: Path | None = None,
) -> BuiltImage:
    """Build ``deploy/Containerfile`` from ``checkout`` (once per content), on Podman or Docker.

    Raises:
        ServiceStartError: a wheel could not be fetched or the build failed (with its log tail).
    """
    started = time.monotonic()
    base = python_image(settings) if _build_wanted(settings, engine) else OFFICIAL_BASE
    digest = hashlib.sha256(f"{base} {extras}".encode())
    for path in _context_files(checkout):
        digest.update(str(path.relative_to(checkout)).encode() + b"\0" + path.read_bytes())
    name = f"{SERVICE_IMAGE}:test-{digest.hexdigest()[:12]}"
    cli = "podman" if engine.kind == "podman" else "docker"
    if _run(cli, "image", "inspect", name, check=False).returncode == 0:
        return BuiltImage(name, base, time.monotonic() - started, cached=True)
    context = settings.cache_dir / "images" / "service-context"
    _stage(checkout, context)
    wheels = context / "build" / "wheels"
    wheels.mkdir(parents=True)
    for wheel in _dependency_wheels(settings, checkout, extras).glob("*.whl"):
        shutil.copy2(wheel, wheels)
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(context))
    build_log = log or settings.cache_dir / "images" / "service-build.log"
    args = ["build", "--build-arg", f"BASE={base}", "--build-arg", f"EXTRAS={extras}"]
    if cli == "podman":
        args += ["--format", "docker"]  # keeps the HEALTHCHECK (OCI images have none)
    args += ["-f", str(context / "deploy" / "Containerfile"), "-t", name, str(context)]
    with build_log.open("w") as out:
        done = subprocess.run([cli, *args], stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        tail = "\n".join(build_log.read_text(errors="replace").splitlines()[-40:])
        raise ServiceStartError(f"{cli} build of {name} failed; the end of its log:\n{tail}")
    shutil.rmtree(context, ignore_errors=True)
    _remove_older(cli, name)
    return BuiltImage(name, base, time.monotonic() - started, cached=False)


def _context_files(checkout: Path) -> list[Path]:
    files: list[Path] = []
    for entry in CONTEXT:
        path = checkout / entry
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.is_file() and _kept(p))
        elif path.is_file():
            files.append(path)
        else:
            raise ServiceStartError(f"{path} is missing: is {checkout} the project's checkout?")
    return files


def _kept(path: Path) -> bool:
    return "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo")


def _stage(checkout: Path, context: Path) -> None:
    shutil.rmtree(context, ignore_errors=True)
    for path in _context_files(checkout):
        target = context / path.relative_to(checkout)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)


def requirements(checkout: Path, extras: str) -> list[str]:
    """The project's dependencies plus those of ``extras``, from its pyproject.toml."""
    project = tomllib.loads((checkout / "pyproject.toml").read_text())["project"]
    found = list(project["dependencies"])
    for extra in extras.split(","):
        found += project["optional-dependencies"][extra.strip()]
    return [r for r in found if not r.startswith(project["name"])]


def _dependency_wheels(settings: HarnessSettings, checkout: Path, extras: str) -> Path:
    """Binary wheels of the pinned dependencies for this platform, fetched once."""
    reqs = requirements(checkout, extras)
    constraints = checkout / "constraints.txt"
    folder = (
        settings.cache_dir / "images" / f"wheels-{_digest(constraints.read_text() + str(reqs))}"
    )
    if folder.is_dir():
        return folder
    partial = folder.with_suffix(".partial")
    shutil.rmtree(partial, ignore_errors=True)
    _run(
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--only-binary=:all:",
        "-c",
        str(constraints),
        "-d",
        str(partial),
        *reqs,
    )
    partial.rename(folder)
    return folder


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    if args[0] == "podman":
        return _podman(*args[1:], check=check)
    done = subprocess.run(list(args), capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise ServiceStartError(f"{' '.join(args[:4])} ... failed: {done.stderr.strip()[-2000:]}")
    return done


def _remove_older(cli: str, keep: str) -> None:
    """Earlier test builds of the service image (one per source change) would fill the disk."""
    listed = _run(cli, "images", "--format", "{{.Repository}}:{{.Tag}}", check=False).stdout
    for image in listed.split():
        if image.startswith(f"{SERVICE_IMAGE}:test-") and image != keep:
            _run(cli, "rmi", image, check=False)


def main() -> int:
    """``make image``: build the service image here and print its name."""
    from outbox.testing.engine import find_engine

    settings = HarnessSettings.from_env()
    engine = find_engine(settings)
    if engine is None:
        print("no container engine: install podman (make system) or start Docker", file=sys.stderr)
        return 3
    checkout = Path(__file__).resolve().parents[2]
    built = build_service_image(settings, engine, checkout)
    state = "up to date" if built.cached else f"built in {built.seconds:.0f} s"
    print(f"{built.name} ({state}, base {built.base})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
