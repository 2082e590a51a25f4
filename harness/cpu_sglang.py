"""Start the real SGLang server on a CPU-only machine (see CPU-SGLANG-RECIPE.md).

No part of SGLang is replaced: a stub `libcuda.so.1` only lets the CUDA-linked
kernel library load, and every process is upstream code (patched or pristine).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from harness import netns

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build"


def sglang_version() -> str:
    """The release of the SGLang this interpreter has (its pin), without the
    series' local version."""
    from importlib.metadata import version

    return version("sglang").split("+")[0]


def pristine_python() -> Path:
    """The pin's pristine tree (`make upstream`), as the repository's python/;
    in a release's smoke (`make smoke RELEASE=...`), that release's."""
    release = os.environ.get("RLSYNC_SMOKE_RELEASE") or sglang_version()
    return BUILD / release / "upstream" / "python"


_STUB_HEADER = """\
/* Generated: every CUDA driver entry point sgl_kernel links against, each
 * answering CUDA_ERROR_NO_DEVICE, so the library loads without a driver. */
"""


def _undefined_cuda_symbols(libs: list[Path]) -> list[str]:
    symbols: set[str] = set()
    for lib in libs:
        out = subprocess.run(
            ["nm", "-D", "--undefined-only", str(lib)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for line in out.splitlines():
            name = line.split()[-1].split("@")[0]
            if name.startswith("cu") and name[2:3].isupper():
                symbols.add(name)
    return sorted(symbols | {"cuInit", "cuDriverGetVersion", "cuDeviceGetCount"})


_PRINT_SGL_KERNEL_DIR = (
    "import importlib.util as u; "
    "print(u.find_spec('sgl_kernel').submodule_search_locations[0])"
)
_GCC_SHARED_LIBCUDA = ["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1"]


def build_stub_libcuda(python: str = sys.executable) -> Path:
    """Build build/stub-cuda/<version>/libcuda.so.1 from the installed kernel
    library."""
    site = subprocess.run(
        [python, "-c", _PRINT_SGL_KERNEL_DIR],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    libs = sorted(Path(site).rglob("*.so"))
    symbols = _undefined_cuda_symbols(libs)
    out_dir = BUILD / "stub-cuda" / sglang_version()
    out_dir.mkdir(parents=True, exist_ok=True)
    source = _STUB_HEADER + "".join(
        f"int {s}(void) {{ return 100; }}\n" for s in symbols
    )
    c_file = out_dir / "stub.c"
    so = out_dir / "libcuda.so.1"
    if so.exists() and c_file.exists() and c_file.read_text() == source:
        return out_dir
    c_file.write_text(source)
    subprocess.run([*_GCC_SHARED_LIBCUDA, "-o", str(so), str(c_file)], check=True)
    return out_dir


def _ephemeral_ports() -> range:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return range(int(low), int(high) + 1)
    except (OSError, ValueError):
        return range(32768, 61000)


_handed_out: set[int] = set()


def free_port() -> int:
    """A port nothing is bound to now, picked at random below the kernel's
    ephemeral range: the outgoing connections of every process (to servers,
    gloo stores) take their ports from that range, so they cannot take this
    one between its pick and its bind. Never one this process handed out
    before (a test that picks a group's port and a store's port before
    either binds would otherwise get the same one twice now and then).
    Another process's free_port() still can: whoever binds it retries on
    "address already in use" (launch, RouterProc)."""
    below = _ephemeral_ports().start
    rng = random.SystemRandom()
    for _ in range(100 if below > 11000 else 0):
        port = rng.randrange(10000, below)
        if port not in _handed_out and _bindable(port):
            _handed_out.add(port)
            return port
    while True:  # the low range is crowded: any free port
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def server_env(stub_dir: Path, ranks: int, pristine: bool = False) -> dict[str, str]:
    """The CPU recipe's environment for a server of `ranks` scheduler
    processes (TP size times DP size)."""
    env = dict(os.environ)
    env.update(
        SGLANG_USE_CPU_ENGINE="1",
        SGLANG_NCCL_SO_PATH="/nonexistent",
        SGLANG_CPU_OMP_THREADS_BIND="|".join(
            str(i % (os.cpu_count() or 1)) for i in range(ranks)
        ),
        # SGLang applies that binding only on AMX and arm64 CPUs; elsewhere each
        # rank starts a thread per core, and a forward pass then waits on
        # whichever thread another busy process preempted.
        OMP_NUM_THREADS="1",
        LD_LIBRARY_PATH=os.pathsep.join(
            filter(None, [str(stub_dir), env.get("LD_LIBRARY_PATH")])
        ),
        PYTHONUNBUFFERED="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    if pristine:
        # Upstream's release from the same environment: the unpacked pristine
        # archive shadows the installed (patched) package.
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(pristine_python()), env.get("PYTHONPATH")])
        )
    elif env.get("RLSYNC_SGLANG_TREE"):
        # A developer's tree (e.g. build/0.5.10/work/python) shadows the installed
        # wheel: try a change to the series before rebuilding the wheel.
        env["PYTHONPATH"] = str(Path(env["RLSYNC_SGLANG_TREE"]).resolve())
        if env.get("RLSYNC_SMOKE_RELEASE"):
            shims = Path(__file__).resolve().parent / "smoke_shims"
            env["PYTHONPATH"] += os.pathsep + str(shims)
    else:
        env.pop("PYTHONPATH", None)
    return env


def run_server_python(
    code: str, *args: str, timeout: float = 300.0
) -> subprocess.CompletedProcess:
    """`python -c code args...` with the SGLang and environment a server of
    this run gets (e.g. to parse a command line as `sglang serve` does,
    without starting one)."""
    env = server_env(build_stub_libcuda(), ranks=1)
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


@dataclass
class Server:
    """A running SGLang server in its own process group."""

    url: str
    port: int
    tp: int
    pristine: bool
    proc: subprocess.Popen
    log_path: Path
    args: list[str] = field(default_factory=list)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_for_log(self, needle: str, timeout: float = 30.0) -> None:
        """Until `needle` shows in the server's log (polled), or TimeoutError."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.log():
                return
            time.sleep(0.1)
        raise TimeoutError(f"{needle!r} not in {self.log_path} after {timeout}s")

    def schedulers(self) -> list:
        """The scheduler processes (psutil.Process), one per TP rank."""
        import psutil

        return [
            p
            for p in psutil.Process(self.proc.pid).children(recursive=True)
            if "scheduler" in p.name()
        ]

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        # Schedulers and the detokenizer share the group; make sure none stays.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass


def launch(
    model_path: Path,
    log_path: Path,
    *,
    tp: int = 1,
    pristine: bool = False,
    extra_args: list[str] | None = None,
    python: str = sys.executable,
    ready_timeout: float = 240.0,
    env_overrides: dict[str, str] | None = None,
    port: int | None = None,
    sleep_on_idle: bool = True,
    netns_host: netns.Host | None = None,
) -> Server:
    """`netns_host`: start it inside that test host's network namespace,
    listening on the host's address (harness.netns). Without `port`, a free
    one is picked, and picked again if another process takes it first."""
    for attempt in range(3):
        try:
            return _launch_once(
                model_path,
                log_path,
                tp=tp,
                pristine=pristine,
                extra_args=extra_args,
                python=python,
                ready_timeout=ready_timeout,
                env_overrides=env_overrides,
                port=port or free_port(),
                sleep_on_idle=sleep_on_idle,
                netns_host=netns_host,
            )
        except PortTaken:
            if port is not None or attempt == 2:
                raise
    raise AssertionError("unreachable")


class PortTaken(RuntimeError):
    """Another process bound the server's port between its pick and its bind."""


def _mem_fraction_static() -> str:
    """The static memory fraction. --max-total-tokens bounds the KV cache, so
    the fraction only bounds what the server may take. From 0.5.11 on, SGLang
    refuses to start ("Loaded weights leave no GPU memory for the KV cache")
    when other processes took more host memory while it loaded its weights
    than the fraction leaves: 5 % failed whenever a trainer or another server
    started beside it on this machine."""
    return "0.05" if sglang_version() == "0.5.10" else "0.3"


def _launch_once(
    model_path: Path,
    log_path: Path,
    *,
    tp: int,
    pristine: bool,
    extra_args: list[str] | None,
    python: str,
    ready_timeout: float,
    env_overrides: dict[str, str] | None,
    port: int,
    sleep_on_idle: bool,
    netns_host: netns.Host | None,
) -> Server:
    stub = build_stub_libcuda(python)
    address = netns_host.address if netns_host else "127.0.0.1"
    options = {
        "--model-path": str(Path(model_path).resolve()),
        "--device": "cpu",
        "--attention-backend": "torch_native",
        "--host": address,
        "--port": str(port),
        "--mem-fraction-static": _mem_fraction_static(),
        "--max-total-tokens": "4096",
        "--tp": str(tp),
    }
    flags = ["--disable-cuda-graph", "--skip-server-warmup"]
    if sleep_on_idle:
        # Idle schedulers sleep instead of polling: 2 cores host several servers.
        flags.append("--sleep-on-idle")
    args = [
        *(netns_host.command() if netns_host else []),
        *(python, "-m", "sglang.launch_server"),
        *(word for option in options.items() for word in option),
        *flags,
        *(extra_args or []),
    ]
    env = server_env(stub, _bind_groups(tp, extra_args or []), pristine)
    env.update(env_overrides or {})
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        args,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=str(BUILD),
        start_new_session=True,
    )
    log.close()
    server = Server(
        url=f"http://{address}:{port}",
        port=port,
        tp=tp,
        pristine=pristine,
        proc=proc,
        log_path=log_path,
        args=args,
    )
    try:
        wait_healthy(server, ready_timeout)
    except BaseException:
        server.stop()
        raise
    return server


def _bind_groups(tp: int, args: list[str]) -> int:
    """The CPU bind groups a server takes: one per TP rank on 0.5.10 (each DP
    replica binds its own), one per scheduler process (TP ranks times DP
    replicas) on later releases."""
    release = tuple(int(part) for part in sglang_version().split(".")[:3])
    return tp if release <= (0, 5, 10) else tp * _dp_size(args)


def _dp_size(args: list[str]) -> int:
    for i, word in enumerate(args):
        if word == "--dp-size" and i + 1 < len(args):
            return int(args[i + 1])
        if word.startswith("--dp-size="):
            return int(word.split("=", 1)[1])
    return 1


def wait_healthy(server: Server, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        taken = "address already in use" in server.log()
        if taken or not server.alive():
            message = (
                f"SGLang server exited with {server.proc.returncode} while starting; "
                f"log tail:\n{server.log()[-4000:]}"
            )
            raise PortTaken(message) if taken else RuntimeError(message)
        try:
            healthy = requests.get(server.url + "/health", timeout=5).status_code == 200
        except requests.RequestException:
            healthy = False
        # A 200 could come from whoever took the port: this server must have
        # reached startup too.
        if healthy and "Application startup complete" in server.log():
            if "address already in use" not in server.log():
                return
        time.sleep(0.25)
    raise TimeoutError(
        f"SGLang server not healthy after {timeout}s; log tail:\n{server.log()[-4000:]}"
    )
