"""The repository's text cites only what the repository holds: the project's design notes and
method spec are not shipped, so a docstring or document that sends the reader there is a dead
end (cite the paper and section, or docs/methods.md, instead); every relative link and anchor
resolves; and the front documents stay short enough to read, with docs/ free of run artefacts."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNSHIPPED = ("DESIGN.md", "METHODS.md")


def shipped_text_files() -> list[Path]:
    files = [*ROOT.joinpath("src").rglob("*.py"), *ROOT.joinpath("tests").rglob("*.py")]
    files += [*ROOT.glob("*.md"), *ROOT.joinpath("docs").rglob("*.md")]
    return [f for f in files if f.resolve() != Path(__file__).resolve()]


def test_nothing_cites_unshipped_documents():
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in shipped_text_files()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if any(name in line for name in UNSHIPPED)
    ]
    assert not offenders, "cite the paper or docs/methods.md instead:\n" + "\n".join(offenders)


def test_the_scan_sees_the_source_tree():
    names = {path.relative_to(ROOT).as_posix() for path in shipped_text_files()}
    assert {"src/specpilot/engine/speculative.py", "README.md", "docs/methods.md"} <= names


README_MAX_LINES = 250
BENCHMARKS_MAX_LINES = 400
DOCS_MAX_BYTES = 10_000_000
# The lab notebook moved there unchanged; its links are as they were at the repository's root.
ARCHIVE = ROOT / "docs" / "benchmarks" / "archive"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def tracked(folder: str) -> list[Path]:
    """Files git tracks under the folder (untracked run outputs do not count); every file there
    where the tree is no git checkout."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--", folder], cwd=ROOT, capture_output=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return [path for path in ROOT.joinpath(folder).rglob("*") if path.is_file()]
    return [ROOT / name for name in out.stdout.decode().split("\0") if name]


def linked_documents() -> list[Path]:
    docs = [p for p in ROOT.joinpath("docs").rglob("*.md") if ARCHIVE not in p.parents]
    return [ROOT / "README.md", ROOT / "BENCHMARKS.md", *docs]


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """Lines outside fenced code blocks (a link or heading there is only an example)."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The heading anchors of a document; a repeated heading gets -1, -2, ... as on GitHub."""
    found, counts = set(), {}
    for _, line in prose_lines(path):
        match = re.match(r"#{1,6} (.+)", line)
        if match:
            base = slug(match.group(1))
            count = counts.get(base, 0)
            counts[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: Path) -> list[str]:
    broken = []
    for number, line in prose_lines(path):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(ROOT)}:{number}: {target}"
            if not resolved.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{where} (no such heading)")
    return broken


def test_the_front_documents_stay_short():
    readme = len(ROOT.joinpath("README.md").read_text(encoding="utf-8").splitlines())
    benchmarks = len(ROOT.joinpath("BENCHMARKS.md").read_text(encoding="utf-8").splitlines())
    assert readme <= README_MAX_LINES, f"README.md has {readme} lines; move detail to docs/guides/"
    assert benchmarks <= BENCHMARKS_MAX_LINES, (
        f"BENCHMARKS.md has {benchmarks} lines; keep the latest table per method family"
    )


def test_tracked_docs_stay_small():
    size = sum(path.stat().st_size for path in tracked("docs") if path.exists())
    assert size <= DOCS_MAX_BYTES, (
        f"docs/ tracks {size / 1e6:.1f} MB; keep only the reports BENCHMARKS.md cites"
    )


def test_every_relative_link_and_anchor_resolves():
    broken = [entry for path in linked_documents() for entry in broken_links(path)]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_slugs_follow_githubs_rules():
    assert slug("8. Goodput controller and SV, batch 1 to 32") == (
        "8-goodput-controller-and-sv-batch-1-to-32"
    )
    assert slug("LTD: learned `tree_depth`") == "ltd-learned-tree_depth"
    assert slug("Eagle (EAGLE-3 head, EAGLE-2 trees)") == "eagle-eagle-3-head-eagle-2-trees"


def test_the_link_check_catches_a_broken_link_and_anchor(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    text = "# The `x` title\n\n[ok](#the-x-title) [bad](#nope) [gone](b.md) `[code](c.md)`\n"
    tmp_path.joinpath("a.md").write_text(text)
    broken = broken_links(tmp_path / "a.md")
    assert [entry.split(": ", 1)[1] for entry in broken] == [
        "#nope (no such heading)",
        "b.md (no such file)",
    ]
