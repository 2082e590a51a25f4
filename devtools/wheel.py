"""The forked wheel of a wheel-only pin: upstream's own wheel with the series
applied, repacked under `<version>+rlsync.<series>` with upstream's tags,
requirements and compiled extensions unchanged.

(A pin made from an sdist builds its wheel with setup.py instead.)
Standard library only.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
import tempfile
import zipfile
from pathlib import Path

from devtools.pin import fetch_archive
from devtools.series import Layout, generated_files, patched_tree


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def version_module(version: str) -> str:
    parts = tuple(int(p) if p.isdigit() else p for p in re.split(r"[.+]", version))
    return (
        f"__version__ = version = {version!r}\n"
        f"__version_tuple__ = version_tuple = {parts!r}\n"
        "__commit_id__ = commit_id = None\n"
    )


def series_contents(layout: Layout) -> dict[str, bytes]:
    """{path in the wheel: bytes} of every file the series changes or adds,
    the generated modules and the version module."""
    pin = layout.pin()
    out: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rel in patched_tree(layout, Path(tmp)):
            path = Path(tmp) / rel
            if path.is_file():
                out[Path(rel).relative_to("python").as_posix()] = path.read_bytes()
    for rel, text in generated_files(layout).items():
        out[Path(rel).relative_to("python").as_posix()] = text.encode()
    out["sglang/_version.py"] = version_module(pin.local_version).encode()
    return out


def build_forked_wheel(layout: Layout, dist: Path) -> Path:
    pin = layout.pin()
    upstream = fetch_archive(pin)
    old_info = f"{pin.name}-{pin.version}.dist-info/"
    new_info = f"{pin.name}-{pin.local_version}.dist-info/"
    changed = series_contents(layout)
    tags = pin.wheel.removesuffix(".whl").split("-")[-3:]
    out = dist / ("-".join([pin.name, pin.local_version, *tags]) + ".whl")
    dist.mkdir(parents=True, exist_ok=True)
    record: list[tuple[str, str, str]] = []

    def put(whl: zipfile.ZipFile, name: str, data: bytes, mode: int) -> None:
        info = zipfile.ZipInfo(name, date_time=(2000, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_DEFLATED
        info.external_attr = (mode & 0xFFFF) << 16
        whl.writestr(info, data)
        record.append((name, _record_hash(data), str(len(data))))

    with zipfile.ZipFile(upstream) as src, zipfile.ZipFile(out, "w") as whl:
        for item in src.infolist():
            name = item.filename
            if item.is_dir() or name == old_info + "RECORD":
                continue
            mode = item.external_attr >> 16 or 0o644
            data = changed.pop(name, None)
            if data is None:
                data = src.read(name)
            if name.startswith(old_info):
                name = new_info + name[len(old_info) :]
                if name == new_info + "METADATA":
                    data = re.sub(
                        rb"^Version: .*$",
                        f"Version: {pin.local_version}".encode(),
                        data,
                        count=1,
                        flags=re.M,
                    )
            put(whl, name, data, mode)
        for name, data in sorted(changed.items()):  # files the series adds
            put(whl, name, data, 0o644)
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerows(record)
        writer.writerow((new_info + "RECORD", "", ""))
        put(whl, new_info + "RECORD", buf.getvalue().encode(), 0o644)
    return out
