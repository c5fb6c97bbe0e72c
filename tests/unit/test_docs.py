"""The repository's text cites only what the repository holds: the project's design notes and
method spec are not shipped, so a docstring or document that sends the reader there is a dead
end. Cite the paper and section, or docs/methods.md, instead."""

from __future__ import annotations

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
