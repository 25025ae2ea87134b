"""The Python that sandboxed processes run, and the drop of privileges that holds as root.

Graded as root without bubblewrap, the test process and the lab processes run as
unprivileged users (``runner.TEST_UID``, ``runner.LAB_UID``), with no capabilities,
``no_new_privs`` and a network namespace of their own. Those users must be able to read
the interpreter: where it lives in a private home (root's is usually mode 0700), this module
builds a *public runtime*, a root-owned folder that others may read and pass through,
holding hard links (or copies, across file systems; each file and folder keeps its
mode: nothing private is made readable) of the interpreter's installation and of the
packages the sandbox imports, and the sandboxed processes run that interpreter. Where
neither works, grading refuses (:class:`SandboxRefused`): lab code never runs as root.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import secrets
import shutil
import stat
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

from grader.sandbox import labserver

# Folders of site-packages the sandbox never imports (the test process runs `-m "not torch"`):
# left out of a public runtime, which is then a few hundred MB of links instead of gigabytes.
LEFT_OUT = {"torch", "torchgen", "functorch", "nvidia", "triton", "transformers", "tokenizers", "cuda",
            "sympy", "mpmath", "networkx", "hf_xet", "huggingface_hub", "safetensors"}
# Of the interpreter's own installation: what no sandboxed process runs.
LEFT_OUT_STDLIB = {"test", "site-packages", "idlelib", "ensurepip", "lib2to3", "tkinter", "turtledemo"}
RUNTIMES = os.environ.get("GRADER_RUNTIME_DIR", "/var/tmp/gptkit-runtimes")
FORMAT = 2  # bumped when the layout below changes
# A public runtime is named by its installation, so each change of the installation (a
# `uv sync`, a new Python) makes a new one beside the old. Each use marks it; the others,
# unused this long, and builds left half-made this long ago, are removed by the next build.
STALE_AFTER_S = 24 * 3600

PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 38, 24
CLONE_NEWNET, CLONE_NEWUSER, CLONE_NEWIPC = 0x40000000, 0x10000000, 0x08000000


class SandboxRefused(RuntimeError):
    """Grading would run lab code with privileges: refused, with one line saying why."""


@dataclass(frozen=True)
class Runtime:
    executable: str
    roots: tuple[str, ...]  # what it reads: the installation and the packages
    site: tuple[str, ...]  # the packages' folders, for sys.path
    env: dict = field(default_factory=dict, hash=False, compare=False)  # added to the processes' environment


def host_runtime() -> Runtime:
    paths = sysconfig.get_paths()
    roots = {sys.base_prefix, sys.prefix, paths["purelib"], paths["platlib"], paths["stdlib"],
             str(Path(os.path.realpath(sys.executable)).parent)}
    return Runtime(sys.executable, tuple(sorted({os.path.realpath(p) for p in roots if p})),
                   tuple(sorted({os.path.realpath(paths["purelib"]), os.path.realpath(paths["platlib"])})))


# -- the drop (runs in the child between fork and exec) --------------------------------------
_libc = ctypes.CDLL(None, use_errno=True)  # loaded now: a forked child must not import
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
try:
    with open("/proc/sys/kernel/cap_last_cap") as _fh:
        CAP_LAST = int(_fh.read())
except (OSError, ValueError):
    CAP_LAST = 63


def no_network() -> None:
    """A network namespace of its own (only a loopback that is down), and an IPC namespace
    (no System V memory or message queue shared with another student's processes of the
    same user): as root, or where an unprivileged user namespace can be made. Raises
    OSError where neither works."""
    if os.geteuid() == 0:
        if _libc.unshare(CLONE_NEWNET | CLONE_NEWIPC) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET | CLONE_NEWIPC)")
        return
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWIPC) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER | CLONE_NEWNET)")
    labserver.map_to_self(uid, gid)


def drop_privileges(uid: int) -> None:
    """From root to ``uid`` for good: no groups, no capabilities (bounding set included),
    no_new_privs. Raises OSError if any step fails (the child then never runs)."""
    for cap in range(CAP_LAST + 1):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"PR_CAPBSET_DROP {cap}")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # all three non-zero: the permitted, effective and ambient sets empty
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    if os.getuid() == 0 or os.geteuid() == 0:
        raise OSError("still root")


PROBE = """
import sys
import numpy, pytest, hypothesis
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
caps = [int(status[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")]
print("ok" if not any(caps) and status["NoNewPrivs"].strip() == "1" else "privileged", status["Uid"].split())
"""


def probe(rt: Runtime, uid: int) -> str:
    """'' when ``rt`` runs as ``uid`` (dropped as the grader drops its sandboxed processes)
    with no capabilities and no_new_privs, and imports what the sandbox needs; else why not."""
    def child():
        no_network()
        drop_privileges(uid)

    try:
        run = subprocess.run([rt.executable, "-I", "-S", "-c", f"import sys; sys.path[:0] = {list(rt.site)!r}\n"
                              + PROBE], preexec_fn=child, capture_output=True, text=True, timeout=120,
                             cwd="/", env={"PATH": "/usr/bin:/bin", **rt.env})
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}: {exc}"
    if run.returncode != 0:
        return (run.stderr.strip().splitlines() or [f"exit code {run.returncode}"])[-1]
    if not run.stdout.startswith("ok"):
        return f"the dropped process still holds privileges ({run.stdout.strip()})"
    return ""


# -- the public runtime --------------------------------------------------------------------
def _key(host: Runtime) -> str:
    h = hashlib.sha256(f"{FORMAT} {sys.version} {host.executable} {os.path.realpath(host.executable)} "
                       f"{sys.base_prefix} {host.site} {sorted(LEFT_OUT)}".encode())
    for folder in (sys.base_prefix, sysconfig.get_paths()["stdlib"], *host.site):
        try:
            for entry in sorted(os.scandir(folder), key=lambda e: e.name):
                st = entry.stat(follow_symlinks=False)
                h.update(f"{entry.name} {st.st_ino} {st.st_mtime_ns}\n".encode())
        except OSError:
            pass
    return h.hexdigest()[:24]


def _link_or_copy(src: str, dst: str) -> str:
    """The same inode where it can (no copy, its mode as it is: nothing private is made
    readable), a copy with the same mode across file systems."""
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copy2(src, dst)
    return dst


def _copy_tree(src: str, dst: str, left_out: dict[str, set[str]]) -> None:
    """``left_out``: folder of ``src`` → names in it not copied."""
    left_out = {os.path.realpath(k): v for k, v in left_out.items()}
    shutil.copytree(src, dst, symlinks=True, copy_function=_link_or_copy,
                    ignore=lambda d, names: [n for n in names if n in left_out.get(os.path.realpath(d), ())])


def _safe_parent(path: str) -> None:
    """``path`` a folder that only root may change (made so when missing)."""
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise SandboxRefused(f"{path} is not a folder that only root may change: remove it, or set "
                             "GRADER_RUNTIME_DIR to one")
    os.chmod(path, 0o755)


def _prune(parent: str, keep: str) -> None:
    """Remove from ``parent`` the public runtimes other than ``keep`` and the half-made
    builds that nothing has used for ``STALE_AFTER_S`` (a runtime's folder is marked at
    each use). Anything else in ``parent`` is left alone."""
    now = time.time()
    for entry in os.scandir(parent):
        named = len(entry.name) == 24 and all(c in "0123456789abcdef" for c in entry.name)
        if entry.name == keep or not (named or entry.name.startswith(".build-")):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and now - st.st_mtime > STALE_AFTER_S:
            shutil.rmtree(entry.path, ignore_errors=True)


def build_public_runtime(host: Runtime, parent: str = RUNTIMES) -> Runtime:
    """The interpreter and the packages, as a root-owned world-readable folder named by a
    hash of the installation: made once (atomically: built aside, then renamed), reused;
    runtimes of other installations unused for a day are removed when a new one is made."""
    _safe_parent(parent)
    final = os.path.join(parent, _key(host))
    if not os.path.isdir(os.path.join(final, "python")):
        _prune(parent, os.path.basename(final))
        tmp = os.path.join(parent, f".build-{secrets.token_hex(8)}")
        os.mkdir(tmp, 0o755)
        try:
            _copy_tree(sys.base_prefix, os.path.join(tmp, "python"),
                       {sys.base_prefix: {"include", "share"}, sysconfig.get_paths()["stdlib"]: LEFT_OUT_STDLIB})
            for i, site in enumerate(host.site):
                _copy_tree(site, os.path.join(tmp, f"site-{i}"), {site: LEFT_OUT})
            os.rename(tmp, final)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not os.path.isdir(os.path.join(final, "python")):  # not made by a grader beside this one
                raise
    os.utime(final)  # in use: not stale for another STALE_AFTER_S
    real = os.path.realpath(host.executable)
    exe = os.path.join(final, "python", os.path.relpath(real, os.path.realpath(sys.base_prefix)))
    site = tuple(os.path.join(final, f"site-{i}") for i in range(len(host.site)))
    lib = os.path.join(final, "python", "lib")
    return Runtime(exe, (os.path.join(final, "python"), *site), site, {"LD_LIBRARY_PATH": lib})


_chosen: list[Runtime] = []


def for_dropped_user(uid: int) -> Runtime:
    """The runtime that ``uid`` (any unprivileged user: they all read the same files) runs,
    as root without bubblewrap: this Python if that user can run it, else a public
    runtime; SandboxRefused if neither."""
    if _chosen:
        return _chosen[0]
    host = host_runtime()
    why = probe(host, uid)
    rt = host
    if why:
        try:
            rt = build_public_runtime(host)
        except (OSError, shutil.Error) as exc:
            raise SandboxRefused(f"refusing to grade as root without bubblewrap: uid {uid} cannot run this Python "
                                 f"({why}) and no public copy of it could be made ({exc}); install bubblewrap "
                                 "or put the kit's Python where other users can read it") from None
        why2 = probe(rt, uid)
        if why2:
            raise SandboxRefused(f"refusing to grade as root without bubblewrap: uid {uid} cannot run this Python "
                                 f"({why}) nor its public copy in {os.path.dirname(rt.site[0])} ({why2}); "
                                 "install bubblewrap or put the kit's Python where other users can read it")
    _chosen.append(rt)
    return rt


_user_net: list[bool] = []


def user_network_namespace() -> bool:
    """Not root: whether an unprivileged user namespace with its own network can be made
    here (tried once in a throw-away child: a half-made one would break the real one)."""
    if not _user_net:
        try:
            ok = subprocess.run(["/bin/true"], preexec_fn=no_network, timeout=30).returncode == 0
        except (OSError, subprocess.SubprocessError):
            ok = False
        _user_net.append(ok)
    return _user_net[0]
