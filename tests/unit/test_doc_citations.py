"""Every document a file cites is in the repository, and so is the section it names.

Code and docs cite a document by its path (`docs/design.md, rule 6`, `docs/nvml.md §3`, `docs/datadog.md, "The
client"`). A citation of a file that is not in the repository (a reference kept elsewhere) or of a section the
document does not hold leaves the reader with nothing, so this scan fails on either.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_SKIP_DIRS = {"build", "dist", "node_modules", "__pycache__"}
_TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".ini", ".service", ".sh"}
_TEXT_NAMES = {"Makefile", "Dockerfile", "run"}
_URL = re.compile(r"\w+://\S+")
# A comment or docstring wrapped over several lines reads as one line: drop newlines with their indentation and
# comment leaders, so a citation split across lines is still one citation.
_WRAP = re.compile(r"[ \t]*\n[ \t]*(?:#+[ \t]*)?")
_DOC = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-][\w.-]*\.md)\b")
_SECTION = re.compile(r'(?:,\s*rule\s+(\d+)\b|\s*§(\d+)\b|(?:,\s*|\s+)"([^"\n]+)")')
_LOOSE_RULE = re.compile(r"\bdesign rule\s+\d+", re.IGNORECASE)


def _text_files(root: Path) -> list[Path]:
    files: list[Path] = []
    for path in root.rglob("*"):
        rel = path.relative_to(root).parts
        if any(part.startswith(".") or part in _SKIP_DIRS or part.endswith(".egg-info") for part in rel[:-1]):
            continue
        if path.is_file() and (path.suffix in _TEXT_SUFFIXES or path.name in _TEXT_NAMES):
            files.append(path)
    return sorted(files)


def _plain(text: str) -> str:
    """Text with markdown emphasis and code marks removed and whitespace collapsed, lower-cased."""
    return " ".join(re.sub(r"[*`_]", "", text).split()).lower()


def _resolve(root: Path, citing: Path, cited: str) -> Path | None:
    for base in (citing.parent, root):
        candidate = (base / cited).resolve()
        if candidate.is_file() and candidate.is_relative_to(root):
            return candidate
    return None


def citation_problems(root: Path) -> list[str]:
    """One line per citation under `root` that names a missing document or a section it does not hold."""
    problems: list[str] = []
    for path in _text_files(root):
        try:
            raw = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        text = _URL.sub(" ", _WRAP.sub(" ", raw))
        where = path.relative_to(root)
        problems.extend(
            f"{where}: '{loose.group(0)}' names no document; cite 'docs/design.md, rule N'"
            for loose in _LOOSE_RULE.finditer(text)
        )
        for match in _DOC.finditer(text):
            doc = _resolve(root, path, match.group(1))
            if doc is None:
                problems.append(f"{where}: cites {match.group(1)}, which is not in the repository")
                continue
            section = _SECTION.match(text, match.end())
            if section is None:
                continue
            rule, numbered, quoted = section.groups()
            body = doc.read_text(encoding="utf-8")
            if rule is not None and not re.search(rf"^{rule}\. ", body, re.MULTILINE):
                problems.append(f"{where}: cites {match.group(1)}, rule {rule}, which it does not define")
            if numbered is not None and not re.search(rf"^#+ §{numbered}\.", body, re.MULTILINE):
                problems.append(f"{where}: cites {match.group(1)} §{numbered}, which it does not hold")
            if quoted is not None and _plain(quoted) not in _plain(body):
                problems.append(f'{where}: cites {match.group(1)}, "{quoted}", which it does not hold')
    return problems


def test_every_cited_document_and_section_is_in_the_repository() -> None:
    assert citation_problems(ROOT) == []


def test_the_scan_catches_missing_documents_sections_and_loose_rules(tmp_path: Path) -> None:
    md, loose = ".md", "design" + " rule 6"
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / f"design{md}").write_text("## Rules\n1. **One.**\n## §2. Two\n## The client\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "ok.py").write_text(
        f"# docs/design{md}, rule 1; docs/design{md} §2; docs/design{md},\n"
        f'# "The client"; see https://example.com/elsewhere{md}\n'
    )
    (tmp_path / "pkg" / "bad.py").write_text(
        f"# reference{md} says so; see {loose}\n"
        f'# docs/design{md}, rule 7 and docs/design{md} §9 and docs/design{md}, "Nowhere"\n'
    )
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "ignored.py").write_text(f"# gone{md}\n")
    problems = citation_problems(tmp_path)
    assert problems == [
        f"pkg/bad.py: '{loose}' names no document; cite 'docs/design.md, rule N'",
        f"pkg/bad.py: cites reference{md}, which is not in the repository",
        f"pkg/bad.py: cites docs/design{md}, rule 7, which it does not define",
        f"pkg/bad.py: cites docs/design{md} §9, which it does not hold",
        f'pkg/bad.py: cites docs/design{md}, "Nowhere", which it does not hold',
    ]
