"""Every code block of README.md and docs/*.md is checked, so none rots; and
every relative link between those pages resolves, anchors included.

Finding blocks. Fenced blocks (``` or ~~~) and indented ones (four spaces
past the text of the list item they sit in, after a blank line). A block is
cut at its blank lines into chunks, and each chunk has a kind: the fence's
info string; else a `<!-- doc-test: KIND -->` comment on a line of its own
before the block (blank lines between are fine); else its first line:

- shell: the first word is a command (`make`, `pip`, `rlsync`, `python`,
  `export`, ...) or a `$ ` prompt; with prompts, the prompt lines are the
  commands and the lines after them their output;
- python: an import, an assignment, a call, `for`, `await`, ...;
- http: `GET /route` or `POST /route {body}` sketches (`-> ...`: answers);
- json: it starts with `{` or `[`;
- trailers: a patch's `Depends:` / `Feature:` / `Forwarded:` lines;
- output: what a program prints, shown as an example: only where marked
  `<!-- doc-test: output -->`. A chunk of no kind fails the test.

What each kind must hold.

- python compiles (`ast.parse`). Blocks are fragments of a trainer's code,
  so a top-level `await` is allowed (compiled as an asyncio REPL compiles
  it, `PyCF_ALLOW_TOP_LEVEL_AWAIT`) and undefined names (`model`,
  `ADMIN_KEY`) are fine. Every `import rlsync...` / `from rlsync... import
  x` must name modules and attributes that exist (importlib + getattr). A
  call of such a name, or of a method of an instance one of them made
  (`sender = WeightSender(...)`; `sender.sync(...)`), must bind to its
  signature: no keyword it lacks, no argument too many. A page's python
  blocks are read in order as one session: a name bound in one is known in
  the next.
- shell, line by line (a trailing `\\` joins the next line; a line that
  starts with `[` continues a usage line), each simple command of a line
  (split at `&&`, `||`, `;`, `|`; `$(...)` checked as a command of its own):
  `make` must name targets the Makefile has (`make -prn`) and `PIN=` /
  `RELEASE=` values the repository has; `rlsync ...` and `python -m rlsync
  ...` must parse with the real parsers (`rlsync.cli.parse_args`,
  `rlsync.services.router.parse_args` for `rlsync router`), URLs as given;
  `python -m sglang.launch_server ...` must parse with the pinned SGLang's
  `ServerArgs.add_cli_args` (that check runs on every pin); `python -c`
  code compiles, `python -m X` names an importable module, `python F` an
  existing file; `pip install ./path[extra]` names a directory and extras
  its pyproject declares (`dist/...` wheels are build outputs, not
  checked); a `torch` requirement is the library's declared range or one
  version in it. `cd`, `export`, `git`, `curl`, `.` (`source`) and `$EDITOR` are not checked;
  any other command fails, so a new one gets a check. A usage line
  (`rlsync status URL... [--api-key K]`) is read as a command: brackets
  around optional parts dropped (the parts kept, so their flags are
  checked), `[options]` dropped, `X...` read as `X`, a metavariable in
  capitals read as `1`, or as `http://host:30000` when it names a URL.
- http: every route a line names exists in the patched server (the pins'
  overlays, `common/`) or in the library's services (router, trainer API).
- json parses; a `"features"` list names features of the series.
- trailers: `Depends:` names a patch file, `Feature:` a feature of the
  series, `Forwarded:` says `no`, `not-needed ...` or a URL.
- output: only its kind is checked.

Running blocks. A block marked `<!-- doc-test: run -->` is run as it is:
its shell lines by bash from the repository root, with `rlsync` and
`python` being this checkout's library and this interpreter; its python as
a script. Each must exit 0. The README's own blocks all need a running
SGLang server (a GPU's, or `make serve-cpu`), so none is marked; of them
only `rlsync --version` needs nothing, and every `rlsync --version` /
`python -m rlsync --version` line of any block is run that way too.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import importlib
import importlib.util
import inspect
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from devtools import releases, series
from harness.doc_blocks import (
    ENV_ASSIGNMENT,
    FENCE,
    HTTP_LINE,
    PAGES,
    TRAILER,
    UNCHECKED_COMMANDS,
    Chunk,
    all_chunks,
    blocks_of,
    chunks_of,
    command_lines,
    reader_env,
)

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 400
SERVER_MODULE = "sglang.launch_server"

METAVARIABLE = re.compile(r"^[A-Z][A-Z0-9_]*$")
SAMPLE_URL = "http://host:30000"


# --- python ------------------------------------------------------------------


def compile_python(text: str) -> ast.Module:
    """The chunk as a module; a top-level `await` is allowed."""
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    return compile(text, "<doc>", "exec", flags=flags, dont_inherit=True)


class _Placeholder:
    """Stands for an argument's value when binding a call to a signature."""


def _resolve_import(node: ast.Import | ast.ImportFrom) -> Iterator[tuple[str, Any]]:
    """(bound name, object) of an rlsync import; raises naming what is missing."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] == "rlsync":
                module = importlib.import_module(alias.name)
                top = alias.asname or alias.name.split(".")[0]
                yield top, module if alias.asname else importlib.import_module(top)
        return
    if not (node.module or "").startswith("rlsync") or node.level:
        return
    module = importlib.import_module(node.module)
    for alias in node.names:
        if not hasattr(module, alias.name):
            importlib.import_module(f"{node.module}.{alias.name}")
        yield alias.asname or alias.name, getattr(module, alias.name)


@dataclass(frozen=True)
class _Instance:
    """A name bound to what an rlsync class made (`sender = WeightSender(...)`)."""

    cls: type


def _callee(func: ast.expr, env: dict[str, Any]) -> tuple[Any, bool] | None:
    """The rlsync object a call calls, and whether it is an instance's method
    (its `self` supplied when binding); None when it is not rlsync's. Raises
    AttributeError for an attribute rlsync lacks."""
    if isinstance(func, ast.Name):
        value = env.get(func.id)
        return None if value is None or isinstance(value, _Instance) else (value, False)
    if not isinstance(func, ast.Attribute):
        return None
    if isinstance(func.value, ast.Name) and isinstance(
        env.get(func.value.id), _Instance
    ):
        return getattr(env[func.value.id].cls, func.attr), True
    base = _callee(func.value, env)
    if base is None or base[1]:
        return None
    return getattr(base[0], func.attr), False


def _bind(call: ast.Call, target: Any, method: bool) -> None:
    """Raises TypeError when the call's arguments do not fit `target`."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(
        k.arg is None for k in call.keywords
    ):
        return
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return
    args = [_Placeholder()] * (len(call.args) + method)
    signature.bind(*args, **{k.arg: _Placeholder() for k in call.keywords})


def python_problems(tree: ast.Module, env: dict[str, Any]) -> list[str]:
    """What in the module names rlsync objects that do not exist or calls
    them with arguments they do not take; `env` gains the module's names."""
    problems: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            try:
                env.update(_resolve_import(node))
            except (ImportError, AttributeError) as e:
                problems.append(f"line {node.lineno}: {ast.unparse(node)}: {e}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            found = _safe_callee(node.value.func, env)
            if found and inspect.isclass(found[0]):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        env[target.id] = _Instance(found[0])
        if isinstance(node, ast.Call):
            problems += _call_problems(node, env)
    return problems


def _safe_callee(func: ast.expr, env: dict[str, Any]) -> tuple[Any, bool] | None:
    try:
        return _callee(func, env)
    except AttributeError:
        return None


def _call_problems(call: ast.Call, env: dict[str, Any]) -> list[str]:
    where = f"line {call.lineno}: {ast.unparse(call.func)}(...)"
    try:
        found = _callee(call.func, env)
    except AttributeError as e:
        return [f"{where}: {e}"]
    if found is None:
        return []
    try:
        _bind(call, *found)
    except TypeError as e:
        return [f"{where}: {e}"]
    return []


# --- shell -------------------------------------------------------------------


def substitutions(line: str) -> tuple[str, list[str]]:
    """The line with each `$(...)` replaced by a word, and their commands."""
    inner: list[str] = []
    out, i = "", 0
    while i < len(line):
        if line.startswith("$(", i):
            depth, j = 1, i + 2
            while j < len(line) and depth:
                depth += {"(": 1, ")": -1}.get(line[j], 0)
                j += 1
            inner.append(line[i + 2 : j - 1])
            out, i = out + "SUBSTITUTED", j
        else:
            out, i = out + line[i], i + 1
    return out, inner


def simple_commands(line: str) -> list[list[str]]:
    """The words of each simple command of a line (comments dropped),
    leading `VAR=value` assignments left out."""
    line, inner = substitutions(line)
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for word in lexer:
        if word and set(word) <= set(";&|"):
            commands.append([])
        elif commands[-1] or not ENV_ASSIGNMENT.match(word):
            commands[-1].append(word)
    return [c for c in commands if c] + [w for i in inner for w in simple_commands(i)]


def usage_words(words: list[str]) -> list[str]:
    """A usage line's words as a command would give them (module docstring)."""
    out = []
    for word in words:
        if word == "[options]":
            continue
        word = word.removesuffix("...").strip("[]").removesuffix("...")
        if METAVARIABLE.match(word):
            word = SAMPLE_URL if "URL" in word else "1"
        out.append(word)
    return out


@functools.cache
def make_targets() -> frozenset[str]:
    """The targets the Makefile has, from make's own database."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS")}
    proc = subprocess.run(
        ["make", "-prn", "help"], cwd=ROOT, capture_output=True, text=True, env=env
    )
    targets, lines = set(), proc.stdout.splitlines()
    for before, line in zip([""] + lines, lines):
        m = re.match(r"^([A-Za-z0-9][\w.-]*):(?!=)", line)
        if m and before != "# Not a target:":
            targets.add(m.group(1))
    return frozenset(targets)


def check_make(words: list[str]) -> list[str]:
    problems = []
    for word in words[1:]:
        if word.startswith("-"):
            continue
        name, eq, value = word.partition("=")
        if not eq:
            if word not in make_targets():
                problems.append(f"make {word}: the Makefile has no target {word!r}")
        elif "<" in value or "$" in value or "..." in value:
            continue
        elif name == "PIN" and value not in series.pin_versions(ROOT):
            problems.append(f"make PIN={value}: no pin {value} (pins/)")
        elif name == "RELEASE" and value not in releases.read_releases(ROOT):
            problems.append(f"make RELEASE={value}: pins/releases has no {value}")
    return problems


def check_rlsync(argv: list[str]) -> list[str]:
    """`rlsync ARGV` as the real parsers read it."""
    from rlsync import cli

    argv = usage_words(argv)
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            if argv[:1] == ["router"]:
                from rlsync.services import router

                router.parse_args(argv[1:])
            else:
                cli.parse_args(argv)
    except SystemExit as e:
        if e.code not in (0, None):
            said = (err.getvalue().strip().splitlines() or ["?"])[-1]
            return [f"rlsync {shlex.join(argv)}: {said}"]
    return []


@functools.cache
def server_parser() -> argparse.ArgumentParser:
    """The pinned SGLang's own command line (the patched server's flags)."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(
        prog=SERVER_MODULE, exit_on_error=False, allow_abbrev=False
    )
    ServerArgs.add_cli_args(parser)
    return parser


def check_server_flags(argv: list[str]) -> list[str]:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            _, unknown = server_parser().parse_known_args(argv)
    except (SystemExit, argparse.ArgumentError) as e:
        said = str(e) if isinstance(e, argparse.ArgumentError) else err.getvalue()
        return [f"{SERVER_MODULE} {shlex.join(argv)}: {said.strip()}"]
    flags = [word for word in unknown if word.startswith("-")]
    if flags or unknown:
        return [f"{SERVER_MODULE}: no flag {' '.join(flags) or unknown[0]}"]
    return []


def check_python_command(words: list[str]) -> list[str]:
    if words[1:2] == ["-c"]:
        try:
            compile_python(words[2])
        except SyntaxError as e:
            return [f"python -c: does not compile: {e}"]
        return []
    if words[1:2] == ["-m"]:
        module, argv = words[2], words[3:]
        if module == "rlsync":
            return check_rlsync(argv)
        if module == SERVER_MODULE:
            return []  # test_server_flags_in_the_docs_are_the_pinned_servers
        if importlib.util.find_spec(module) is None:
            return [f"python -m {module}: no such module"]
        return []
    if not (ROOT / words[1]).is_file():
        return [f"python {words[1]}: no such file"]
    return []


@functools.cache
def library_torch() -> SpecifierSet:
    """The torch versions the library declares (python/pyproject.toml)."""
    project = tomllib.loads((ROOT / "python" / "pyproject.toml").read_text())
    (torch,) = [
        r
        for r in map(Requirement, project["project"]["dependencies"])
        if r.name == "torch"
    ]
    return torch.specifier


def check_torch(word: str) -> list[str]:
    """A torch to install first: the library's range, or one version in it
    (unpinned, pip may take a torch the library then replaces)."""
    spec, declared = Requirement(word).specifier, library_torch()
    if spec == declared:
        return []
    pinned = [s.version for s in spec if s.operator == "=="]
    if len(spec) == 1 and pinned and pinned[0] in declared:
        return []
    return [f"pip install {word}: the library takes torch{declared}; name that range"]


def check_pip(words: list[str]) -> list[str]:
    problems = []
    for word in words[2:]:
        if re.match(r"^torch\b(?![-\w])", word):
            problems += check_torch(word)
            continue
        if not word.startswith("./"):
            continue
        m = re.match(r"^(.*?)(?:\[([\w,]+)\])?$", word)
        path, extras = ROOT / m.group(1), (m.group(2) or "").split(",")
        if not path.is_dir():
            problems.append(f"pip install {word}: no directory {m.group(1)}")
            continue
        project = tomllib.loads((path / "pyproject.toml").read_text())["project"]
        declared = project.get("optional-dependencies", {})
        problems += [
            f"pip install {word}: {m.group(1)} declares no extra {x!r}"
            for x in extras
            if x and x not in declared
        ]
    return problems


def command_problems(words: list[str]) -> list[str]:
    name = words[0]
    if name == "make":
        return check_make(words)
    if name == "rlsync":
        return check_rlsync(words[1:])
    if name in ("python", "python3"):
        return check_python_command(words)
    if name == "pip":
        return check_pip(words)
    if name in UNCHECKED_COMMANDS:
        return []
    return [f"{name}: no check for this command: add one to tests/test_docs.py"]


def server_commands(text: str) -> list[list[str]]:
    """The arguments of each SGLang server command (SERVER_MODULE) of a chunk."""
    return [
        words[3:]
        for line in command_lines(text)
        for words in simple_commands(line)
        if words[:3]
        in (["python", "-m", SERVER_MODULE], ["python3", "-m", SERVER_MODULE])
    ]


def version_commands(text: str) -> list[str]:
    """Lines that run `rlsync --version`: they need nothing, so they run."""
    return [
        shlex.join(words)
        for line in command_lines(text)
        for words in simple_commands(line)
        if words in (["rlsync", "--version"], ["python", "-m", "rlsync", "--version"])
    ]


# --- http, json, trailers ----------------------------------------------------


@functools.cache
def route_sources() -> str:
    """The code that declares routes: the patched server (every pin's
    overlay, the shared modules) and the library's services."""
    files = [
        *ROOT.glob("pins/*/overlay/**/*.py"),
        *ROOT.glob("common/**/*.py"),
        *ROOT.glob("python/rlsync/services/*.py"),
    ]
    return "\n".join(p.read_text() for p in files)


def http_problems(text: str) -> list[str]:
    return [
        f"{m.group(1)} {m.group(2)}: no such route in the server or the services"
        for m in map(HTTP_LINE.match, text.splitlines())
        if m and f'"{m.group(2)}"' not in route_sources()
    ]


@functools.cache
def features() -> frozenset[str]:
    return frozenset(
        name
        for version in series.pin_versions(ROOT)
        for name in series.series_features(series.Layout(ROOT, version).patches())
    )


def json_problems(text: str) -> list[str]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return [f"not JSON: {e}"]
    named = value.get("features", []) if isinstance(value, dict) else []
    return [
        f"features: {f!r} is no feature of the series"
        for f in named
        if f not in features()
    ]


def trailer_problems(text: str) -> list[str]:
    patches = {p.stem for p in ROOT.glob("pins/*/patches/*.patch")}
    problems = []
    for line in text.splitlines():
        m = TRAILER.match(line.strip())
        if not m:
            problems.append(f"{line!r}: not a trailer")
        elif m.group(1) == "Depends" and m.group(2) not in patches:
            problems.append(f"Depends: {m.group(2)}: no such patch")
        elif m.group(1) == "Feature" and m.group(2) not in features():
            problems.append(f"Feature: {m.group(2)}: no feature of the series")
        elif m.group(1) == "Bug" and not re.match(r"^https://\S+$", m.group(2)):
            problems.append(f"Bug: {m.group(2)}: not the URL of an upstream issue")
        elif m.group(1) == "Forwarded" and not re.match(
            r"^(no|not-needed\b.*|https?://\S+)$", m.group(2)
        ):
            problems.append(f"Forwarded: {m.group(2)}: not no, not-needed or a URL")
    return problems


# --- every chunk -------------------------------------------------------------


def shell_problems(text: str) -> list[str]:
    return [
        p
        for line in command_lines(text)
        for words in simple_commands(line)
        for p in command_problems(words)
    ]


def chunk_problems(chunk: Chunk, env: dict[str, Any]) -> list[str]:
    """What is wrong with a chunk; `env`: the page's python names so far."""
    if chunk.kind is None:
        return [
            "no kind: fence it with its language, or mark it "
            "`<!-- doc-test: output -->` when it shows what a program prints"
        ]
    if chunk.kind == "python":
        try:
            tree = compile_python(chunk.text)
        except SyntaxError as e:
            return [f"does not compile: {e}"]
        return python_problems(tree, env)
    check = {
        "shell": shell_problems,
        "http": http_problems,
        "json": json_problems,
        "trailers": trailer_problems,
        "output": lambda text: [],
    }[chunk.kind]
    return check(chunk.text)


def page_problems(chunks: list[Chunk]) -> dict[str, list[str]]:
    """Each chunk's problems, a page's python read in order as one session."""
    envs: dict[str, dict[str, Any]] = {}
    out = {}
    for chunk in chunks:
        env = envs.setdefault(chunk.page, {})
        out[chunk.where] = chunk_problems(chunk, env)
    return out


CHUNKS = all_chunks()


@functools.cache
def problems_by_chunk() -> dict[str, list[str]]:
    return page_problems(CHUNKS)


@pytest.mark.parametrize("chunk", CHUNKS, ids=lambda c: c.where)
def test_code_block_is_current(chunk: Chunk):
    assert problems_by_chunk()[chunk.where] == [], chunk.text


@pytest.mark.per_pin
@pytest.mark.parametrize(
    "chunk",
    [c for c in CHUNKS if c.kind == "shell" and server_commands(c.text)],
    ids=lambda c: c.where,
)
def test_server_flags_in_the_docs_are_the_pinned_servers(chunk: Chunk):
    problems = [
        p for argv in server_commands(chunk.text) for p in check_server_flags(argv)
    ]
    assert problems == [], chunk.text


# --- running ----------------------------------------------------------------


def run_chunk(chunk: Chunk, env: dict[str, str]) -> list[str]:
    """Run a chunk as a reader would; the failures, with their output."""
    if chunk.kind == "python":
        runs = [[sys.executable, "-c", chunk.text]]
    else:
        runs = [["bash", "-c", line] for line in command_lines(chunk.text)]
    failed = []
    for argv in runs:
        proc = subprocess.run(
            argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        if proc.returncode != 0:
            failed.append(f"{argv[-1]}: exit {proc.returncode}: {proc.stderr[-2000:]}")
    return failed


RUNNABLE = [c for c in CHUNKS if c.run]


@pytest.mark.parametrize("chunk", RUNNABLE, ids=lambda c: c.where)
def test_marked_block_runs_as_it_is(chunk: Chunk, tmp_path: Path):
    assert chunk.kind in ("shell", "python"), f"{chunk.where}: cannot run {chunk.kind}"
    assert run_chunk(chunk, reader_env(tmp_path)) == []


VERSION_LINES = [
    (c, line) for c in CHUNKS if c.kind == "shell" for line in version_commands(c.text)
]


@pytest.mark.parametrize(
    "chunk,line", VERSION_LINES, ids=[f"{c.where}:{l}" for c, l in VERSION_LINES]
)
def test_rlsync_version_line_runs_and_names_the_series(chunk, line, tmp_path):
    proc = subprocess.run(
        ["bash", "-c", line],
        cwd=ROOT,
        env=reader_env(tmp_path),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert re.match(r"^rlsync \S+ \(weight-update series \d+; SGLang ", proc.stdout)


def test_the_readmes_rlsync_version_line_is_among_those_run():
    assert [c.where for c, _ in VERSION_LINES if c.page == "README.md"] != []


# --- links ------------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but `-` and
    `_` dropped, spaces as `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors_of(text: str) -> set[str]:
    """Every heading's anchor; a repeated one gets `-1`, `-2`, ... as on GitHub."""
    seen: dict[str, int] = {}
    anchors = set()
    in_fence = False
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        m = HEADING.match(line)
        if m and not in_fence:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            anchors.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
    return anchors


def link_problems(page: Path, root: Path = ROOT) -> list[str]:
    """Relative links of a page that lead nowhere, anchors included."""
    text = re.sub(r"`[^`\n]*`", "", page.read_text())
    problems = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            problems.append(f"{target}: no {dest.relative_to(root)}")
        elif anchor and anchor not in anchors_of(dest.read_text()):
            problems.append(f"{target}: {dest.relative_to(root)} has no #{anchor}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(page: Path):
    assert link_problems(page) == []


def test_readme_is_at_most_400_lines():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md: {lines} lines"


def test_every_docs_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    linked = {target.partition("#")[0] for target in LINK.findall(readme)}
    pages = {str(p.relative_to(ROOT)) for p in PAGES[1:]}
    assert pages - linked == set()


# --- the checks catch rot ----------------------------------------------------


def problems_of_page(markdown: str) -> list[str]:
    """Every problem of a made-up page's blocks."""
    chunks = [c for b in blocks_of("page.md", markdown) for c in chunks_of(b)]
    return [p for problems in page_problems(chunks).values() for p in problems]


def test_a_make_target_the_makefile_lacks_is_named():
    page = "Build:\n\n    make wheel PIN=0.5.10\n    make wheels\n"
    assert problems_of_page(page) == [
        "make wheels: the Makefile has no target 'wheels'"
    ]
    assert problems_of_page("x\n\n    make wheel PIN=9.9\n") == [
        "make PIN=9.9: no pin 9.9 (pins/)"
    ]


def test_an_rlsync_command_the_cli_does_not_take_is_named():
    good = "x\n\n    $ rlsync status http://a:30000 --timeout 3\n    a  healthy\n"
    assert problems_of_page(good) == []
    usage = (
        "x\n\n    rlsync sync-disk --path P URL... [--vllm URL]... [--admin-key K]\n"
    )
    assert problems_of_page(usage) == []
    (problem,) = problems_of_page("x\n\n    rlsync status http://a:30000 --wait 3\n")
    assert "unrecognized arguments: --wait 3" in problem
    (problem,) = problems_of_page("x\n\n    python -m rlsync status a:30000\n")
    assert "needs a scheme" in problem
    (problem,) = problems_of_page("x\n\n    rlsync router http://a:1 --hosts h\n")
    assert "unrecognized arguments: --hosts h" in problem


def test_python_that_does_not_compile_or_names_what_rlsync_lacks_is_named():
    (problem,) = problems_of_page("x\n\n    sender = WeightSender(\n")
    assert problem.startswith("does not compile")
    page = "x\n\n    from rlsync.client import weights_checksum, no_such_thing\n"
    (problem,) = problems_of_page(page)
    assert "no_such_thing" in problem
    assert problems_of_page("x\n\n    from rlsync.nowhere import x\n") != []


def test_a_call_with_arguments_rlsync_does_not_take_is_named():
    page = (
        "x\n\n    from rlsync.sender import Engine, WeightSender\n\n"
        '    sender = WeightSender([Engine("http://a:1", tp_size=1)], master_port=1)\n'
        "    sender.sync(model, weight_versio='1')\n"
        "    await sender.sync_stream_async(specs, tensors)\n"
        "\nNext block, same page:\n\n    sender.connect(wait=1, retries=3)\n"
    )
    assert problems_of_page(page) == [
        "line 4: sender.sync(...): got an unexpected keyword argument 'weight_versio'",
        "line 1: sender.connect(...): got an unexpected keyword argument 'retries'",
    ]


def test_a_block_of_no_kind_is_named_unless_marked_as_output():
    text = "    SyncError: connect: HTTP 404: not patched\n"
    assert problems_of_page(f"x\n\n{text}")[0].startswith("no kind")
    assert problems_of_page(f"x\n\n<!-- doc-test: output -->\n\n{text}") == []


def test_routes_json_and_trailers_are_checked():
    page = "x\n\n    POST /prepare_weights_update {}\n    GET /no_such_route\n"
    assert problems_of_page(page) == [
        "GET /no_such_route: no such route in the server or the services"
    ]
    assert problems_of_page(
        'x\n\n    {"features": ["two_phase_weight_update", "x"]}\n'
    ) == ["features: 'x' is no feature of the series"]
    assert problems_of_page("x\n\n    Feature: teleport\n    Forwarded: no\n") == [
        "Feature: teleport: no feature of the series"
    ]


def test_a_broken_link_or_anchor_is_named(tmp_path: Path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A page\n\n## Its `part` (two)\n")
    page = docs / "b.md"
    page.write_text(
        "[ok](a.md#its-part-two) [bad anchor](a.md#part) [gone](c.md) [web](https://x)"
    )
    assert link_problems(page, tmp_path) == [
        "a.md#part: docs/a.md has no #part",
        "c.md: no docs/c.md",
    ]


def test_a_server_flag_the_pinned_sglang_lacks_is_named():
    (problem,) = check_server_flags(
        ["--model-path", "m", "--weight-update-deadline", "1"]
    )
    assert problem == f"{SERVER_MODULE}: no flag --weight-update-deadline"


@pytest.mark.parametrize(
    "line,ok",
    [
        ("pip install 'torch>=2.6,<2.15' --index-url https://x/cpu", True),
        ("pip install torch==2.9.1 --index-url https://x/cu128", True),
        ("pip install torch --index-url https://x/cpu", False),
        ("pip install 'torch>=2.6' --index-url https://x/cpu", False),
        ("pip install torch==2.15.0", False),
        ("pip install torchvision", True),
    ],
)
def test_a_torch_to_install_first_is_one_the_library_takes(line, ok):
    assert (problems_of_page(f"x\n\n    {line}\n") == []) is ok
