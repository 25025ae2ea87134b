"""Reading submissions: a student's copy of the kit as a folder or a .zip.

Only the files under ``labs/NN_name/src/`` are taken: the lab's modules, and the
student's own helper modules and small data files beside them (within size limits);
everything else in a submission — its tests, conftest, pytest config, pyproject — is
ignored. Zips are read defensively: no
absolute paths, no ``..``, no links, bounded sizes.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from gptkit.testing.layout import KIT_ROOT, lab_dirs

MAX_ZIP_BYTES = 50 * 1024 * 1024  # the .zip file itself
MAX_MEMBER_BYTES = 2 * 1024 * 1024  # one lab module, uncompressed
MAX_MEMBERS = 20000
MAX_LAB_FILES = 64  # files in one lab's src/: its modules, helper modules, small data files
MAX_LAB_BYTES = 8 * 1024 * 1024
MAX_DEPTH = 4  # folders below src/


class SubmissionError(ValueError):
    """The submission cannot be graded at all (one line, shown to the instructor)."""


@dataclass
class Submission:
    student: str
    source: Path
    files: dict[str, dict[str, bytes]] = field(default_factory=dict)  # lab → path under src/ → bytes
    notes: list[str] = field(default_factory=list)  # flags found while reading

    def modules(self, lab: str) -> dict[str, bytes]:
        """The lab's top-level Python modules (its own and its helpers): module name → source."""
        return {rel[:-3]: data for rel, data in self.files.get(lab, {}).items()
                if rel.endswith(".py") and "/" not in rel}

    def python_files(self, lab: str) -> dict[str, bytes]:
        """Every Python file of the lab (helper packages included): path under src/ → source."""
        return {rel: data for rel, data in self.files.get(lab, {}).items() if rel.endswith(".py")}

    def digest(self) -> str:
        h = hashlib.sha256()
        for lab in sorted(self.files):
            for mod in sorted(self.files[lab]):
                h.update(f"{lab}/{mod}\0".encode())
                h.update(hashlib.sha256(self.files[lab][mod]).digest())
        return h.hexdigest()


MANIFEST = Path(__file__).with_name("lab_modules.json")  # written by `grader release`


def expected_files(source: Path | None = None) -> dict[str, list[str]]:
    """lab → the module names the tests import from it (the student writes these; any other
    file in ``src/`` is a helper of the student's own). From the reference solutions; in a
    student's copy, which has none, from the list ``grader release`` wrote."""
    solutions = KIT_ROOT / "solutions"
    if source is None or Path(source) == solutions:
        if solutions.is_dir():
            return {lab.name: lab.modules() for lab in lab_dirs(solutions)}
        if MANIFEST.is_file():
            return {k: list(v) for k, v in json.loads(MANIFEST.read_text(encoding="utf-8")).items()}
        source = KIT_ROOT / "labs"
    if Path(source) == KIT_ROOT / "labs" and not solutions.is_dir() and MANIFEST.is_file():
        return expected_files()
    return {lab.name: lab.modules() for lab in lab_dirs(Path(source))}


def discover(paths: list[Path]) -> list[tuple[str, Path]]:
    """(student id, path) for each submission among ``paths``.

    A path that is itself a kit copy (it has ``labs/``) or a .zip is one submission;
    any other folder holds one submission per entry, named by the entry.
    """
    found: list[tuple[str, Path]] = []
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise SubmissionError(f"{path}: no such file or folder")
        if path.is_file() or (path / "labs").is_dir():
            found.append((_student_id(path), path))
            continue
        for entry in sorted(path.iterdir()):
            if entry.name.startswith(".") or entry.name.upper().startswith("README"):
                continue  # notes beside the submissions are not submissions
            if entry.is_dir() or entry.suffix.lower() == ".zip" or entry.is_file():
                found.append((_student_id(entry), entry))
    return found


def unique_ids(entries: list[tuple[str, Path]]) -> list[tuple[str, Path]]:
    """Two entries with one id (x/ and x.zip): both kept, the second as ``x~2``."""
    seen: dict[str, int] = {}
    unique = []
    for student, p in entries:
        seen[student] = seen.get(student, 0) + 1
        unique.append((student if seen[student] == 1 else f"{student}~{seen[student]}", p))
    return unique


def _student_id(path: Path) -> str:
    name = path.name[:-4] if path.name.lower().endswith(".zip") else path.name
    return "".join(c if c.isalnum() or c in "-_.@" else "_" for c in name) or "student"


def read_submission(student: str, path: Path, wanted: dict[str, list[str]]) -> Submission:
    """Every file under ``labs/NN_name/src/`` of the labs in ``wanted`` (its modules,
    helper modules and small data files), within the size limits."""
    sub = Submission(student, Path(path))
    if Path(path).is_dir():
        _read_dir(sub, Path(path), wanted)
    elif Path(path).suffix.lower() == ".zip":
        _read_zip(sub, Path(path), wanted)
    else:
        raise SubmissionError(f"not a folder or a .zip file ({Path(path).name})")
    if not any(sub.files.values()):
        raise SubmissionError("no lab files found (expected labs/NN_name/src/<module>.py)")
    return sub


def _skipped(rel: str) -> bool:
    """Files in a lab's ``src/`` that are not the student's work: caches and hidden files."""
    parts = rel.split("/")
    return any(p.startswith(".") or p == "__pycache__" for p in parts) or rel.endswith((".pyc", ".pyo"))


class _LabFiles:
    """Collects one lab's files under the limits, with a note for each file left out."""

    def __init__(self, sub: Submission, lab: str):
        self.sub, self.lab, self.count, self.bytes = sub, lab, 0, 0

    def add(self, rel: str, size: int, read) -> None:
        where = f"labs/{self.lab}/src/{rel}"
        if _skipped(rel):
            return
        if len(rel.split("/")) > MAX_DEPTH:
            self.sub.notes.append(f"{where} is nested more than {MAX_DEPTH} folders deep: ignored")
            return
        if size > MAX_MEMBER_BYTES:
            self.sub.notes.append(f"{where} is larger than {MAX_MEMBER_BYTES // 1024} KB: ignored")
            return
        if self.count >= MAX_LAB_FILES or self.bytes + size > MAX_LAB_BYTES:
            self.sub.notes.append(f"{where} ignored: a lab's src/ may hold at most {MAX_LAB_FILES} files "
                                  f"and {MAX_LAB_BYTES // 2**20} MB")
            return
        data = read()
        if data is None:
            return
        if len(data) > MAX_MEMBER_BYTES:
            self.sub.notes.append(f"{where} is larger than {MAX_MEMBER_BYTES // 1024} KB: ignored")
            return
        self.count += 1
        self.bytes += len(data)
        self.sub.files.setdefault(self.lab, {})[rel] = data


def _read_dir(sub: Submission, root: Path, wanted: dict[str, list[str]]) -> None:
    base = _find_kit_root_dir(root)
    for lab in wanted:
        src = base / "labs" / lab / "src"
        if not src.is_dir() or src.is_symlink():
            continue
        collect = _LabFiles(sub, lab)
        for dirpath, dirnames, filenames in os.walk(src):  # os.walk does not follow links to folders
            dirnames[:] = sorted(d for d in dirnames if not _skipped(d))
            for name in sorted(filenames):
                f = Path(dirpath) / name
                rel = f.relative_to(src).as_posix()
                if _skipped(rel):
                    continue
                if f.is_symlink():
                    sub.notes.append(f"labs/{lab}/src/{rel} is a symbolic link: ignored")
                    continue
                if not f.is_file():
                    continue
                collect.add(rel, f.stat().st_size, f.read_bytes)
        for d in sorted(p for p in src.rglob("*") if p.is_symlink() and p.is_dir()):
            sub.notes.append(f"labs/{lab}/src/{d.relative_to(src).as_posix()} is a symbolic link: ignored")


def _find_kit_root_dir(root: Path) -> Path:
    if (root / "labs").is_dir():
        return root
    subdirs = [d for d in root.iterdir() if d.is_dir() and not d.is_symlink() and (d / "labs").is_dir()]
    if len(subdirs) == 1:
        return subdirs[0]
    return root


def _read_zip(sub: Submission, path: Path, wanted: dict[str, list[str]]) -> None:
    size = path.stat().st_size
    if size == 0:
        raise SubmissionError("the .zip file is empty")
    if size > MAX_ZIP_BYTES:
        raise SubmissionError(f"the .zip file is {size / 1e6:.0f} MB, over the {MAX_ZIP_BYTES // 10**6} MB limit")
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise SubmissionError(f"not a readable .zip file ({exc})") from None
    with zf:
        infos = zf.infolist()
        if len(infos) > MAX_MEMBERS:
            raise SubmissionError(f"the .zip holds {len(infos)} entries, over the {MAX_MEMBERS} limit")
        members = []
        for info in infos:
            name = info.filename
            p = PurePosixPath(name.replace("\\", "/"))
            if name.startswith("/") or p.is_absolute() or ".." in p.parts or (len(name) > 1 and name[1] == ":"):
                sub.notes.append(f"unsafe path in zip ignored: {name[:80]}")
                continue
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                sub.notes.append(f"symbolic link in zip ignored: {name[:80]}")
                continue
            if not info.is_dir():
                members.append((str(p), info))
        for lab, modules in wanted.items():
            # The lab's src/ folder: the shallowest one in the zip that holds one of its modules
            # (a zip of the kit's folder, or of the folder around it).
            marker = f"labs/{lab}/src/"
            roots = sorted({posix[:posix.index(marker) + len(marker)] for posix, _ in members
                            if marker in posix and (posix.startswith(marker) or f"/{marker}" in posix)
                            and posix.split(marker, 1)[1] in {f"{m}.py" for m in modules}}, key=len)
            if not roots:
                continue
            collect = _LabFiles(sub, lab)
            for posix, info in members:
                if not posix.startswith(roots[0]):
                    continue

                def read(info=info, posix=posix):
                    try:
                        with zf.open(info) as fh:
                            return fh.read(MAX_MEMBER_BYTES + 1)
                    except (zipfile.BadZipFile, OSError, RuntimeError, EOFError) as exc:
                        sub.notes.append(f"{posix} could not be read from the zip ({exc})")
                        return None

                collect.add(posix[len(roots[0]):], info.file_size, read)
