"""The forked wheel: upstream's requirements, the patched modules, the local
version, nothing else; and `python/` installable alone as the trainer-side
`rlsync`, every command of which works outside this repository."""

from __future__ import annotations

import email.message
import email.parser
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import httpx
import pytest
from conftest import ACTIVE_PIN
from packaging.requirements import Requirement

import rlsync
from devtools import series

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = series.Layout(ROOT, ACTIVE_PIN)
PIN = LAYOUT.pin()
# A wheel-only release's forked wheel keeps upstream's tags.
TAGS = PIN.wheel.removesuffix(".whl").split("-", 2)[2] if PIN.wheel else "py3-none-any"
WHEEL = ROOT / "dist" / f"sglang-{PIN.local_version}-{TAGS}.whl"
LIB_WHEEL = ROOT / "dist" / f"rlsync-{rlsync.__version__}-py3-none-any.whl"


def requires(metadata_text: str) -> set[str]:
    msg = email.parser.Parser().parsestr(metadata_text)
    return {str(Requirement(r)) for r in msg.get_all("Requires-Dist") or []}


@pytest.fixture(scope="module")
def wheel() -> zipfile.ZipFile:
    assert WHEEL.is_file(), f"{WHEEL} missing; `make test` builds it"
    return zipfile.ZipFile(WHEEL)


def upstream_metadata(upstream_tree: Path) -> str:
    """The pristine archive's metadata: the sdist's PKG-INFO, or the wheel's
    dist-info METADATA."""
    pristine = upstream_tree / "python"
    if PIN.wheel:
        return (pristine / f"sglang-{PIN.version}.dist-info" / "METADATA").read_text()
    return (pristine / "PKG-INFO").read_text()


def upstream_licence(upstream_tree: Path) -> bytes:
    """The pristine archive's licence file: the sdist's LICENSE, or the one
    in the wheel's dist-info."""
    pristine = upstream_tree / "python"
    if PIN.wheel:
        info = pristine / f"sglang-{PIN.version}.dist-info"
        return (info / "licenses" / "LICENSE").read_bytes()
    return (pristine / "LICENSE").read_bytes()


def dist_info(whl: zipfile.ZipFile) -> str:
    """The wheel's `<name>-<version>.dist-info` folder."""
    meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
    return meta.removesuffix("/METADATA")


def wheel_metadata(whl: zipfile.ZipFile) -> email.message.Message:
    text = whl.read(f"{dist_info(whl)}/METADATA").decode()
    return email.parser.Parser().parsestr(text)


@pytest.mark.per_pin
def test_wheel_requires_exactly_upstream(wheel, upstream_tree):
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    ours = requires(wheel.read(meta).decode())
    upstream = requires(upstream_metadata(upstream_tree))
    assert ours == upstream
    assert len(ours) > 50
    assert f"Version: {PIN.local_version}\n" in wheel.read(meta).decode()


@pytest.mark.per_pin
def test_wheel_ships_every_upstream_file_and_patched_ones(wheel, upstream_tree):
    names = set(wheel.namelist())
    pristine = upstream_tree / "python"
    upstream_files = {
        p.relative_to(pristine).as_posix()
        for p in (pristine / "sglang").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert upstream_files <= names
    if PIN.wheel:  # upstream's compiled extensions, byte for byte
        extensions = [n for n in upstream_files if n.endswith(".so")]
        assert extensions
        for name in extensions:
            assert wheel.read(name) == (pristine / name).read_bytes(), name
        assert wheel.testzip() is None
    for rel in series.series_files(LAYOUT.patches()):
        inner = Path(rel).relative_to("python").as_posix()
        assert wheel.read(inner) == series.built_file(LAYOUT, rel).read_bytes(), inner
    # Pristine + overlay only: the trainer library is its own distribution.
    assert not [n for n in names if n.startswith("rlsync")]
    assert not [n for n in names if n.startswith("devtools")]
    assert [
        n for n in names if n.endswith("dist-info/licenses/LICENSE") or "/LICENSE" in n
    ]
    entry = next(n for n in wheel.namelist() if n.endswith("entry_points.txt"))
    assert "rlsync" not in wheel.read(entry).decode()


@pytest.mark.per_pin
def test_wheel_metadata_names_upstreams_licence_file_not_a_build_path(
    wheel, upstream_tree
):
    ours = wheel_metadata(wheel)
    upstream = email.parser.Parser().parsestr(upstream_metadata(upstream_tree))
    assert ours.get_all("License-File") == upstream.get_all("License-File")
    assert ours.get_all("License-File") == ["LICENSE"]
    licences = f"{dist_info(wheel)}/licenses/"
    assert [n for n in wheel.namelist() if n.startswith(licences)] == [
        licences + "LICENSE"
    ]
    assert wheel.read(licences + "LICENSE") == upstream_licence(upstream_tree)
    assert not [n for n in wheel.namelist() if "wheel-src" in n or "build/" in n]


@pytest.mark.per_pin
def test_wheel_metadata_keeps_upstreams_long_description(wheel, upstream_tree):
    ours = wheel_metadata(wheel)
    upstream = email.parser.Parser().parsestr(upstream_metadata(upstream_tree))
    assert ours["Description-Content-Type"] == upstream["Description-Content-Type"]
    assert ours["Description-Content-Type"] == "text/markdown"
    assert "SGLang" in upstream.get_payload()
    assert ours.get_payload() == upstream.get_payload()


def test_rlsync_wheel_ships_the_apache_licence_its_metadata_declares():
    assert LIB_WHEEL.is_file(), f"{LIB_WHEEL} missing; `make wheel` builds it"
    with zipfile.ZipFile(LIB_WHEEL) as whl:
        meta = wheel_metadata(whl)
        licences = f"{dist_info(whl)}/licenses/"
        shipped = [n for n in whl.namelist() if n.startswith(licences)]
        text = whl.read(licences + "LICENSE").decode() if shipped else ""
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert shipped == [licences + "LICENSE"]
    assert text == (ROOT / "python" / "LICENSE").read_text()
    assert "Apache License\n" in text and "Version 2.0, January 2004" in text


def test_wheel_builds_with_setuptools_alone(tmp_path):
    """`make wheel` needs no test environment: the system interpreter, its
    pip and the package index (for setuptools) are enough."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")
    }
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    proc = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "wheel", "PYTHON=/usr/bin/env python3"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert WHEEL.is_file() and LIB_WHEEL.is_file()


def fresh_venv(venv: Path) -> tuple[Path, str]:
    """A new venv that borrows the pinned stack through a .pth (ours first)."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True
    )
    py = venv / "bin" / "python"
    site = subprocess.check_output(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True,
    ).strip()
    (Path(site) / "pinned-stack.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n"
    )
    return py, site


def pip_install(py: Path, wheel: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet"]
        + ["--no-deps", "--no-index", "--ignore-installed", str(wheel)],
        check=True,
    )


def test_wheel_in_fresh_venv_layered_on_pinned_env(tmp_path):
    py, site = fresh_venv(tmp_path / "venv")
    pip_install(py, WHEEL)
    code = (
        "import sglang, sglang.srt.utils.watchdog as w;"
        "print(sglang.__version__); print(w.__file__); print(hasattr(w.Watchdog, 'pause'))"
    )
    out = subprocess.check_output([str(py), "-c", code], text=True).splitlines()
    assert out[0] == PIN.local_version
    assert out[1].startswith(site)
    assert out[2] == "True"


def test_rlsync_alone_needs_only_torch_numpy_and_an_http_client(tmp_path):
    # Build from a copy: setuptools leaves build/ and *.egg-info beside its input.
    src = tmp_path / "src"
    shutil.copytree(
        ROOT / "python",
        src,
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"),
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"]
        + ["--no-build-isolation", "-w", str(tmp_path), str(src)],
        check=True,
    )
    (whl,) = tmp_path.glob("rlsync-*.whl")
    with zipfile.ZipFile(whl) as zf:
        meta = next(n for n in zf.namelist() if n.endswith("METADATA"))
        reqs = [Requirement(r) for r in requires(zf.read(meta).decode())]
        # numpy: torch warns at every import without it.
        assert {r.name for r in reqs if r.marker is None} == {"torch", "httpx", "numpy"}
        # The router is an extra: `pip install 'rlsync[router]'`.
        extra = {
            r.name for r in reqs if r.marker and r.marker.evaluate({"extra": "router"})
        }
        assert extra == {"fastapi", "uvicorn", "prometheus-client"}
        assert not [n for n in zf.namelist() if n.startswith("sglang/")]


def test_every_installed_rlsync_command_works_outside_the_clone(tmp_path):
    """The library's wheel in a new venv, run from a folder that is not this
    repository: every subcommand answers (none needs a checkout)."""
    py, site = fresh_venv(tmp_path / "venv")
    pip_install(py, LIB_WHEEL)
    script = py.parent / "rlsync"
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {"PATH": f"{py.parent}:/usr/bin:/bin", "HOME": str(tmp_path)}

    def rlsync_cmd(*args: str, exe: tuple[str, ...] = (str(script),)):
        return subprocess.run(
            [*exe, *args], cwd=away, env=env, capture_output=True, text=True
        )

    where = rlsync_cmd("-c", "import rlsync; print(rlsync.__file__)", exe=(str(py),))
    assert where.stdout.startswith(site), where.stdout + where.stderr
    version = rlsync_cmd("--version")
    assert version.returncode == 0
    assert f"rlsync {rlsync.__version__} (weight-update series {PIN.series}" in (
        version.stdout
    )
    assert rlsync_cmd("--version", exe=(str(py), "-m", "rlsync")).stdout == (
        version.stdout
    )
    helps = rlsync_cmd("--help").stdout
    commands = re.search(r"\{([a-z,-]+)\}", helps).group(1).split(",")
    assert sorted(commands) == ["checksum", "doctor", "router", "status", "sync-disk"]
    for command in commands:
        proc = rlsync_cmd(command, "--help")
        assert proc.returncode == 0, (command, proc.stderr)
    # A real run of each, against an address where nothing listens.
    nothing = "http://127.0.0.1:9"
    status = rlsync_cmd("status", nothing, "--timeout", "2")
    assert status.returncode == 1 and "unreachable" in status.stdout
    reload = rlsync_cmd("sync-disk", "--path", "/nowhere", nothing, "--timeout", "2")
    assert reload.returncode == 1 and "FAILED" in reload.stdout
    checksum = rlsync_cmd("checksum", nothing, "--timeout", "2")
    assert checksum.returncode == 1 and "FAILED" in checksum.stdout
    doctor = rlsync_cmd("doctor", nothing, "--timeout", "2", "--backend", "gloo")
    assert doctor.returncode == 1 and "cannot sync" in doctor.stdout
    runs = [status, reload, checksum, doctor]
    assert not any("checkout" in run.stderr for run in runs)
    for command in (("status",), ("router",), ("sync-disk", "--path", "/x")):
        schemeless = rlsync_cmd(*command, "127.0.0.1:9")
        assert schemeless.returncode == 2, (command, schemeless.stderr)
        assert "needs a scheme: http://127.0.0.1:9" in schemeless.stderr
    assert_router_serves(script, nothing, away, env, tmp_path / "router.log")


def assert_router_serves(script: Path, worker: str, cwd: Path, env, log_path: Path):
    """`rlsync router` starts and answers /workers, the dead worker listed."""
    for _attempt in range(3):  # a port picked free may be taken before bind
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [str(script), "router", worker, "--port", str(port)],
                cwd=cwd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    answer = httpx.get(f"http://127.0.0.1:{port}/workers", timeout=2)
                except httpx.TransportError:
                    time.sleep(0.2)
                    continue
                assert answer.status_code == 200, answer.text
                assert worker in answer.text
                return
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        if "address already in use" not in log_path.read_text().lower():
            break
    pytest.fail(f"router did not serve:\n{log_path.read_text()}")
