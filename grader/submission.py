"""Reading submissions: a student's copy of the kit as a folder or a .zip.

Only the files the labs ask students to write are taken (``labs/NN_name/src/<module>.py``
for the modules the reference solution defines); everything else in a submission — its
tests, conftest, pytest config, pyproject — is ignored. Zips are read defensively: no
absolute paths, no ``..``, no links, bounded sizes.
"""

from __future__ import annotations

import hashlib
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from gptkit.testing.layout import KIT_ROOT, lab_dirs

MAX_ZIP_BYTES = 50 * 1024 * 1024  # the .zip file itself
MAX_MEMBER_BYTES = 2 * 1024 * 1024  # one lab module, uncompressed
MAX_MEMBERS = 20000


class SubmissionError(ValueError):
    """The submission cannot be graded at all (one line, shown to the instructor)."""


@dataclass
class Submission:
    student: str
    source: Path
    files: dict[str, dict[str, bytes]] = field(default_factory=dict)  # lab → module → source
    notes: list[str] = field(default_factory=list)  # flags found while reading

    def digest(self) -> str:
        h = hashlib.sha256()
        for lab in sorted(self.files):
            for mod in sorted(self.files[lab]):
                h.update(f"{lab}/{mod}\0".encode())
                h.update(hashlib.sha256(self.files[lab][mod]).digest())
        return h.hexdigest()


def expected_files(solutions: Path = KIT_ROOT / "solutions") -> dict[str, list[str]]:
    """lab → the module names students write for it."""
    return {lab.name: lab.modules() for lab in lab_dirs(solutions)}


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


def _read_dir(sub: Submission, root: Path, wanted: dict[str, list[str]]) -> None:
    base = _find_kit_root_dir(root)
    for lab, modules in wanted.items():
        for module in modules:
            f = base / "labs" / lab / "src" / f"{module}.py"
            if f.is_symlink():
                sub.notes.append(f"labs/{lab}/src/{module}.py is a symbolic link: ignored")
                continue
            if f.is_file():
                data = f.read_bytes()
                if len(data) > MAX_MEMBER_BYTES:
                    sub.notes.append(f"labs/{lab}/src/{module}.py is larger than {MAX_MEMBER_BYTES // 1024} KB: ignored")
                    continue
                sub.files.setdefault(lab, {})[module] = data


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
        targets = {f"labs/{lab}/src/{m}.py": (lab, m) for lab, mods in wanted.items() for m in mods}
        candidates: dict[str, list[zipfile.ZipInfo]] = {}
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
            posix = str(p)
            for target in targets:
                if posix == target or posix.endswith("/" + target):
                    candidates.setdefault(target, []).append(info)
        for target, infos_for in candidates.items():
            info = min(infos_for, key=lambda i: len(i.filename))  # the shallowest copy
            lab, module = targets[target]
            if info.file_size > MAX_MEMBER_BYTES:
                sub.notes.append(f"{target} is larger than {MAX_MEMBER_BYTES // 1024} KB uncompressed: ignored")
                continue
            try:
                with zf.open(info) as fh:
                    data = fh.read(MAX_MEMBER_BYTES + 1)
            except (zipfile.BadZipFile, OSError, RuntimeError, EOFError) as exc:
                sub.notes.append(f"{target} could not be read from the zip ({exc})")
                continue
            if len(data) > MAX_MEMBER_BYTES:
                sub.notes.append(f"{target} is larger than {MAX_MEMBER_BYTES // 1024} KB uncompressed: ignored")
                continue
            sub.files.setdefault(lab, {})[module] = data
