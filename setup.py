"""The forked wheel of a pin made from an sdist: sglang <pin>+rlsync.<n> =
pristine sdist + patch series, nothing else (the trainer library is its own
distribution, `python/`; a wheel-only pin's forked wheel is upstream's wheel
repacked, devtools/wheel.py).

Build with `make wheel [PIN=<version>]` (RLSYNC_PIN names the pin; default the
oldest): setuptools and the standard library only. Install requirements are
read from the pinned sdist's metadata, so they are exactly upstream's.
"""

import email.parser
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from setuptools import find_namespace_packages, setup

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from devtools.series import (  # noqa: E402
    Layout,
    ensure_upstream,
    generated_files,
    patched_tree,
)

_EXTRA = re.compile(r'\s*(?:and\s+)?extra == "([^"]+)"\s*')


def upstream_requirements(pkg_info: Path):
    install, extras = [], {}
    for line in pkg_info.read_text().splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        req, _, marker = line[len("Requires-Dist: ") :].partition(";")
        found = _EXTRA.search(marker)
        if not found:
            install.append(line[len("Requires-Dist: ") :])
            continue
        rest = _EXTRA.sub(" ", marker).strip()
        rest = re.sub(r"\s+and\s*$", "", rest).strip()
        extras.setdefault(found.group(1), []).append(
            f"{req.strip()}; {rest}" if rest else req.strip()
        )
    return install, extras


def upstream_long_description(pkg_info: Path) -> tuple[str, str]:
    """(description, content type) as upstream ships them: the body of the
    sdist's PKG-INFO (its README) and its Description-Content-Type."""
    meta = email.parser.Parser().parsestr(pkg_info.read_text())
    return meta.get_payload(), meta["Description-Content-Type"]


def stage(layout: Layout) -> Path:
    pristine = ensure_upstream(layout) / "python"
    out = layout.build_dir / "wheel-src"
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(pristine / "sglang", out / "sglang")
    with tempfile.TemporaryDirectory() as tmp:
        for rel in patched_tree(layout, Path(tmp)):
            dst = out / Path(rel).relative_to("python")
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(tmp) / rel, dst)
    # What the server reports at /rlsync_info (series, pin, features).
    for rel, text in generated_files(layout).items():
        dst = out / Path(rel).relative_to("python")
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(text)
    version = layout.pin().local_version
    (out / "sglang" / "_version.py").write_text(
        f"__version__ = version = {version!r}\n"
        f"__version_tuple__ = version_tuple = {tuple(re.split(r'[.+]', version))!r}\n"
        "__commit_id__ = commit_id = None\n"
    )
    shutil.copyfile(pristine / "LICENSE", out / "LICENSE")
    return out


layout = Layout(ROOT, os.environ.get("RLSYNC_PIN", ""))
pin = layout.pin()
if pin.wheel:
    sys.exit(f"pin {pin.version} is wheel-only: `make wheel PIN={pin.version}`")
src = stage(layout)
pkg_info = layout.upstream_dir / "python" / "PKG-INFO"
install_requires, extras_require = upstream_requirements(pkg_info)
long_description, long_description_content_type = upstream_long_description(pkg_info)
# The staged tree is the project, as upstream's python/ is for its own build:
# setuptools takes license files (and their paths in the wheel's metadata)
# relative to the working directory, so LICENSE is recorded as `LICENSE`.
os.chdir(src)
# Upstream's pyproject finds namespace packages and ships every file in them.
packages = find_namespace_packages(include=["sglang", "sglang.*"])

setup(
    name="sglang",
    version=pin.local_version,
    description=f"SGLang {pin.version} with the rlsync weight-update series",
    long_description=long_description,
    long_description_content_type=long_description_content_type,
    license="Apache-2.0",
    license_files=["LICENSE"],
    python_requires=">=3.10",
    packages=packages,
    package_data={"sglang": ["**/*", "**/.*", "**/.*/**/*"]},
    exclude_package_data={"": ["__pycache__/*", "*.pyc"]},
    install_requires=install_requires,
    extras_require=extras_require,
    entry_points={
        "console_scripts": [
            "sglang = sglang.cli.main:main",
            "killall_sglang = sglang.cli.killall:main",
        ]
    },
)
