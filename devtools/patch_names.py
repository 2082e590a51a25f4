"""Patch file names: what a patch does, never where it sits, the same on
every pin.

A patch file is `<name>.patch`, lowercase words joined by hyphens and no
number: the order lives in `series` alone, so inserting or moving a patch
renames nothing, and `Depends:` lines, ports and documents keep naming it.
A patch that adds a feature (`Feature: two_phase_weight_update`) is named
after it (`two-phase-weight-update.patch`), so one feature has one name on
every pin; a patch without one keeps the name it was given, and one patch
text on two pins (the same subject) has the same name on both. `make
patches` names a new patch from its subject.

Standard library only, as the rest of devtools.
"""

from __future__ import annotations

import re
from pathlib import Path

NAME = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*\.patch")
MAX_LENGTH = 48  # ".patch" included
# As series.patch_trailers reads them: a line may list several names.
_FEATURE = re.compile(r"^Feature:[ \t]*(.*?)[ \t]*$", re.M)
_DIFF_FILE = re.compile(r"^diff --git a/\S+ b/(\S+)$", re.M)
_SUBJECT = re.compile(r"^Subject: (?:\[PATCH[^\]]*\] )?(.*(?:\n .*)*)", re.M)


def subject(text: str) -> str:
    """A patch file's subject, unfolded (without `[PATCH]`)."""
    head = text.partition("\ndiff --git ")[0]
    found = _SUBJECT.search(head)
    return " ".join(found.group(1).split()) if found else ""


def features(text: str) -> list[str]:
    """The `Feature:` names of a patch file's message."""
    head = text.partition("\ndiff --git ")[0]
    return [
        name
        for line in _FEATURE.findall(head)
        for name in re.split(r"[,\s]+", line)
        if name
    ]


def _touched(text: str) -> set[str]:
    return set(_DIFF_FILE.findall(text))


def feature_file_name(feature: str) -> str:
    """`two_phase_weight_update` -> `two-phase-weight-update.patch`."""
    return feature.replace("_", "-").lower() + ".patch"


def name_from_subject(text: str) -> str:
    """A name for a new patch without a feature: its subject's words after
    the area prefix ("weight sync: ..."), as many as fit."""
    words = re.sub(r"^[\w /.-]+: ", "", subject(text)).lower()
    words = re.sub(r"[^a-z0-9]+", "-", words).strip("-")
    if not words[:1].isalpha():
        words = f"patch-{words}".strip("-")
    room = MAX_LENGTH - len(".patch")
    name = ""
    for word in words.split("-"):
        longer = f"{name}-{word}" if name else word
        if len(longer) > room:
            break
        name = longer
    return (name or words[:room].strip("-")) + ".patch"


def expected_name(text: str) -> str | None:
    """The name a patch file must have, where its message decides it (one
    `Feature:` line); None where the name is the series' choice."""
    found = features(text)
    return feature_file_name(found[0]) if len(found) == 1 else None


def check_names(patches: list[Path]) -> list[str]:
    """One pin's series: every name a number-free slug, a feature's patch
    named after its feature."""
    problems = []
    for patch in patches:
        if not NAME.fullmatch(patch.name):
            problems.append(
                f"{patch.name}: a patch is named for what it does: lowercase "
                "letters, digits and hyphens, starting with a letter (no "
                "number first: the order lives in series)"
            )
        elif len(patch.name) > MAX_LENGTH:
            problems.append(
                f"{patch.name}: longer than {MAX_LENGTH} characters; name it shorter"
            )
        expected = expected_name(patch.read_text())
        if expected is not None and patch.name != expected:
            problems.append(
                f"{patch.name}: adds feature {features(patch.read_text())[0]}, so "
                f"it is named {expected} (the same on every pin)"
            )
    return problems


def check_names_across_pins(series: dict[str, list[Path]]) -> list[str]:
    """Every pin's series together: one subject, one name."""
    named: dict[str, tuple[str, str]] = {}
    problems = []
    for version, patches in series.items():
        for patch in patches:
            said = subject(patch.read_text())
            first = named.setdefault(said, (version, patch.name))
            if first[1] != patch.name:
                problems.append(
                    f"{version}: {patch.name}: the same patch is {first[1]} on "
                    f"{first[0]} (subject {said!r}); one name on every pin"
                )
    return problems


def export_names(texts: list[str], current: list[Path]) -> list[str]:
    """The file names of freshly exported patch texts (in series order),
    given the series they replace: a feature's name; else the name of the
    current patch with the same subject; else, when no patch was added or
    dropped, the name at the same place (a reworded subject keeps its name);
    else a name from the subject. ValueError if two would share a name."""
    by_subject = {subject(p.read_text()): p.name for p in current}
    names = [expected_name(t) or by_subject.get(subject(t)) for t in texts]
    if len(texts) == len(current):
        for i, name in enumerate(names):
            kept, was = current[i].name, current[i].read_text()
            # A reworded subject keeps its place's name; a new patch in a
            # dropped one's place (other files) does not inherit it.
            same_place = kept not in names and expected_name(was) is None
            if name is None and same_place and _touched(was) == _touched(texts[i]):
                names[i] = kept
    names = [name or name_from_subject(t) for name, t in zip(names, texts)]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(
            f"two patches would be named {', '.join(twice)}: give one another "
            "subject or feature"
        )
    return names
