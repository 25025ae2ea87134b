"""Runs as ``_grader_labserver.py``: the process that holds a submission's lab code.

The grader starts it for each lab (and again after the lab code kills it), with nothing
but its side of a socket to the test process: where the kernel has both walls below, as
a fork of this file's zygote (one per submission, a fresh interpreter that loads NumPy
once and never runs lab code), elsewhere as a fresh interpreter of its own. It imports the student's modules
and answers requests in plain data (``gptkit.testing.wire``): import a module, read or
set an attribute, call something, index, take a length. Objects that are not plain data
stay here and travel as numbered handles. It holds no token and no way to write a test
result: whatever the lab code does in this process, the test process judges only the
values it receives.

    python -I -S -B _grader_labserver.py FD CONFIG_FD
    python -I -S -B _grader_labserver.py --zygote CONTROL_FD BASE_CONFIG_FD
    python -I -S -B _grader_labserver.py --walls
    python -I -S -B _grader_labserver.py --namespaces
"""

import gc
import json
import os
import signal
import socket
import sys
import time
import traceback
import types
import warnings


class TestTimeLimit(BaseException):
    """The per-test CPU budget ran out inside lab code (a BaseException: ``except
    Exception`` in lab code does not swallow it)."""


COMPILE_RECURSION = 30_000  # the recursion limit while lab modules are imported (see Server._do)


def _on_prof(signum, frame):
    raise TestTimeLimit("this test used more than its CPU-time budget (an infinite loop, or far too slow)")


# The kernel's wall (seccomp): this process and its threads may not start another
# process, run another program, make a socket or a device, or trace/read/signal another
# process. Every call that sends a signal is refused (kill, tkill, tgkill, the sigqueue
# calls, pidfd_send_signal; its own process included), and so is every way to have the
# kernel send one for it: a file's owner for SIGIO/SIGURG (fcntl F_SETOWN, F_SETOWN_EX,
# F_SETSIG, ioctl FIOSETOWN/SIOCSPGRP, a terminal's TIOCSPGRP), leases and dnotify
# (F_SETLEASE, F_NOTIFY), perf events. io_uring is refused whole: its operations
# (IORING_OP_SOCKET, …) pass no system call that this filter would see. So are
# socketpair, mknod/mknodat, new namespaces (unshare, setns), another process's files,
# memory or limits (pidfd_getfd, process_madvise, process_mrelease, kcmp, prlimit64 on
# another pid), bpf and userfaultfd.
# Nor may it make a kernel object that could outlive it or that another process could
# find: a key in a keyring (add_key, request_key, keyctl: a uid's keyrings outlive its
# processes), a SysV shared memory segment, message queue or semaphore set, a POSIX
# message queue; nor an anonymous memory file (memfd_create, memfd_secret), an inotify or
# fanotify watch on the files another process writes, or a core of its choosing
# (sched_setaffinity: the grader shares the cores out between submissions).
# Threads stay allowed (clone with CLONE_THREAD; clone3 answers ENOSYS so the C library
# falls back to clone). Unlike the audit hook below, lab code cannot get around it:
# ``_posixsubprocess.fork_exec``, for one, raises no audit event, but it needs clone().
_SHARED = {425: "io_uring_setup", 426: "io_uring_enter", 427: "io_uring_register", 424: "pidfd_send_signal",
           434: "pidfd_open", 438: "pidfd_getfd", 440: "process_madvise", 448: "process_mrelease"}
_OBJECTS = {  # machine: kernel objects that outlive a process or reach another (see above)
    "x86_64": {248: "add_key", 249: "request_key", 250: "keyctl", 29: "shmget", 30: "shmat", 31: "shmctl",
               67: "shmdt", 64: "semget", 65: "semop", 66: "semctl", 220: "semtimedop", 68: "msgget",
               69: "msgsnd", 70: "msgrcv", 71: "msgctl", 240: "mq_open", 241: "mq_unlink", 242: "mq_timedsend",
               243: "mq_timedreceive", 244: "mq_notify", 245: "mq_getsetattr", 319: "memfd_create",
               447: "memfd_secret", 253: "inotify_init", 254: "inotify_add_watch", 294: "inotify_init1",
               300: "fanotify_init", 301: "fanotify_mark", 203: "sched_setaffinity"},
    "aarch64": {217: "add_key", 218: "request_key", 219: "keyctl", 194: "shmget", 195: "shmctl", 196: "shmat",
                197: "shmdt", 190: "semget", 191: "semctl", 192: "semtimedop", 193: "semop", 186: "msgget",
                187: "msgctl", 188: "msgrcv", 189: "msgsnd", 180: "mq_open", 181: "mq_unlink", 182: "mq_timedsend",
                183: "mq_timedreceive", 184: "mq_notify", 185: "mq_getsetattr", 279: "memfd_create",
                447: "memfd_secret", 26: "inotify_init1", 27: "inotify_add_watch", 262: "fanotify_init",
                263: "fanotify_mark", 122: "sched_setaffinity"},
}
_FCNTL_SIGNALS = {8, 10, 15, 1024, 1026}  # F_SETOWN, F_SETSIG, F_SETOWN_EX, F_SETLEASE, F_NOTIFY
_IOCTL_SIGNALS = {0x8901, 0x8902, 0x5410, 0x5412}  # FIOSETOWN, SIOCSPGRP, TIOCSPGRP, TIOCSTI
_NO_PROCESSES = {
    # machine: (AUDIT_ARCH, clone, clone3, syscalls refused with EPERM,
    #           {syscall: (argument, values refused, name)}: refused when the low 32 bits of that argument match)
    "x86_64": (0xC000003E, 56, 435, {**_SHARED, **_OBJECTS["x86_64"], 57: "fork", 58: "vfork", 59: "execve", 322: "execveat",
                                     101: "ptrace", 310: "process_vm_readv", 311: "process_vm_writev",
                                     41: "socket", 53: "socketpair", 62: "kill", 200: "tkill", 234: "tgkill",
                                     129: "rt_sigqueueinfo", 297: "rt_tgsigqueueinfo", 133: "mknod",
                                     259: "mknodat", 312: "kcmp", 298: "perf_event_open", 321: "bpf",
                                     323: "userfaultfd", 272: "unshare", 308: "setns"},
               {72: (1, _FCNTL_SIGNALS, "fcntl"), 16: (1, _IOCTL_SIGNALS, "ioctl"), 302: (0, None, "prlimit64")}),
    "aarch64": (0xC00000B7, 220, 435, {**_SHARED, **_OBJECTS["aarch64"], 221: "execve", 281: "execveat", 117: "ptrace",
                                       270: "process_vm_readv", 271: "process_vm_writev", 198: "socket",
                                       199: "socketpair", 129: "kill", 130: "tkill", 131: "tgkill",
                                       138: "rt_sigqueueinfo", 240: "rt_tgsigqueueinfo", 33: "mknodat",
                                       272: "kcmp", 241: "perf_event_open", 280: "bpf", 282: "userfaultfd",
                                       97: "unshare", 268: "setns"},
                {25: (1, _FCNTL_SIGNALS, "fcntl"), 29: (1, _IOCTL_SIGNALS, "ioctl"), 261: (0, None, "prlimit64")}),
}
# (prlimit64's ``None``: refused for any pid but 0, this process: setrlimit passes 0.)


def _libc_without_new_privileges():
    """The C library through ctypes, after PR_SET_NO_NEW_PRIVS (which both kernel walls
    below need, and which nothing here ever undoes); None if the kernel refused it."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    libc.syscall.restype = ctypes.c_long
    return libc if libc.prctl(38, 1, 0, 0, 0) == 0 else None  # PR_SET_NO_NEW_PRIVS


def map_to_self(uid, gid):
    """In a user namespace this process has just made: its uid and gid are themselves there
    (and it may not change its groups). Raises OSError if the kernel refuses. The grader's
    own set-up uses it too (``runtime.no_network``)."""
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)


def _own_namespaces():
    """Before any wall and any lab code, while this process has one thread: a user
    namespace and an IPC namespace of its own, a new session keyring, and a mount
    namespace of its own with /proc read-only (see below). What a lab
    process makes of the kernel's shared objects then lives in these and dies with it:
    its user, user-session and persistent keyrings are kept in its user namespace's
    registers, not its uid's (Linux ≥ 5.3), System V memory, queues and semaphores and
    POSIX message queues in its IPC namespace, its session keyring is its own (not one
    inherited from the grader); no other process is in either namespace, and the next
    one gets new ones. Its uid and gid stay what they were (mapped to themselves), and it
    keeps no capability in the new namespace. True if the kernel allowed all of it."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    libc.syscall.restype = ctypes.c_long
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(0x10000000 | 0x08000000 | 0x20000) != 0:  # CLONE_NEWUSER | CLONE_NEWIPC | CLONE_NEWNS
        return False
    try:
        map_to_self(uid, gid)
    except OSError:
        return False
    # Its /proc read-only, now that the maps are written: no /proc file opens for writing
    # (EROFS), so /proc/self/clear_refs cannot reset the peak memory (VmHWM) the grader
    # reads. A mount flag, not the audit hook: the capabilities dropped below were its
    # only ones over this mount namespace, and a mount namespace it makes later gets the
    # mount locked read-only. The grader cannot do it for it (bubblewrap, ``_private_tmp``):
    # the maps above are /proc files too. Its other flags stay as they are (locked).
    keep = os.statvfs("/proc").f_flag & (os.ST_NOSUID | os.ST_NODEV | os.ST_NOEXEC)  # = MS_NOSUID, MS_NODEV, MS_NOEXEC
    if libc.mount(None, b"/proc", None, 0x1000 | 0x20 | 0x1 | keep, None) != 0:  # MS_BIND | MS_REMOUNT | MS_RDONLY
        return False
    # The new namespace gave this process every capability in it: none is kept.
    cap = 0
    while libc.prctl(24, cap, 0, 0, 0) == 0:  # PR_CAPBSET_DROP, until the kernel knows no more
        cap += 1
    libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    if libc.capset(header, (ctypes.c_uint32 * 6)()) != 0:
        return False
    keyctl = 250 if os.uname().machine == "x86_64" else 219
    # The keys of a lab process that just ended count against its uid's quota until the
    # kernel collects them: a moment's wait, not a failure.
    for _ in range(40):
        if libc.syscall(keyctl, ctypes.c_int(1), None) >= 0:  # KEYCTL_JOIN_SESSION_KEYRING, a new anonymous one
            break
        time.sleep(0.05)
    else:
        return False
    with open("/proc/self/status") as fh:
        status = dict(line.split(":", 1) for line in fh if ":" in line)
    return not any(int(status[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"))


def _no_new_processes():
    """Install the seccomp filter; True if the kernel took it (False on another machine
    type or a kernel without seccomp: the other walls stand alone then)."""
    import ctypes
    import struct

    machine = os.uname().machine
    if machine not in _NO_PROCESSES:
        return False
    arch, clone, clone3, refused, by_argument = _NO_PROCESSES[machine]
    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JSET|K, BPF_RET|K
    allow, kill = 0x7FFF0000, 0x80000000  # SECCOMP_RET_ALLOW, SECCOMP_RET_KILL_PROCESS
    eperm, enosys = 0x00050000 | 1, 0x00050000 | 38  # SECCOMP_RET_ERRNO | errno
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, kill),  # another ABI: refuse everything
            (ld, 0, 0, 0)]
    if machine == "x86_64":  # the x32 ABI numbers its calls from 0x40000000
        prog += [(0x35, 0, 1, 0x40000000), (ret, 0, 0, eperm)]  # BPF_JMP|JGE|K
    for nr in refused:
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, eperm)]
    for nr, (arg, values, _name) in by_argument.items():
        # seccomp_data: nr (u32), arch (u32), instruction pointer (u64), args[6] (u64 each):
        # the low 32 bits of args[i] at 16 + 8 i on these little-endian machines, which is
        # all of an int argument the kernel reads (fcntl's cmd, ioctl's request, a pid).
        block = [(ld, 0, 0, 16 + 8 * arg)]
        if values is None:  # refused unless 0
            block += [(jeq, 1, 0, 0), (ret, 0, 0, eperm)]
        else:
            for v in sorted(values):
                block += [(jeq, 0, 1, v), (ret, 0, 0, eperm)]
        block += [(ret, 0, 0, allow)]
        prog += [(jeq, 0, len(block), nr), *block]
    prog += [(jeq, 0, 1, clone3), (ret, 0, 0, enosys),
             (jeq, 0, 4, clone), (ld, 0, 0, 16),  # clone's flags (low half of args[0])
             (jset, 0, 1, 0x00010000), (ret, 0, 0, allow),  # CLONE_THREAD: a thread
             (ret, 0, 0, eperm),
             (ret, 0, 0, allow)]
    code = b"".join(struct.pack("HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("HxxxxxxP", len(prog), ctypes.addressof(buf))  # struct sock_fprog
    fbuf = ctypes.create_string_buffer(fprog, len(fprog))
    libc = _libc_without_new_privileges()
    return libc is not None and libc.prctl(22, 2, ctypes.addressof(fbuf), 0, 0) == 0  # PR_SET_SECCOMP, FILTER


def _files_fence(read_roots, write_roots, list_roots=()):
    """Landlock (Linux ≥ 5.13, no privileges needed): from here on the kernel lets this
    process, and every thread of it, read only under ``read_roots`` (and its own /proc
    entries), list the folders under ``list_roots`` (the import path: importing walks
    it) and write only under ``write_roots``, whatever lab code calls. The mount
    namespace and the users do the same job under bubblewrap or as root; this fence also
    holds without either. True if the kernel took it."""
    import ctypes
    import struct

    create, add_rule, restrict_self = 444, 445, 446  # the same numbers on x86-64 and ARM64
    if os.uname().machine not in _NO_PROCESSES:  # the machines whose numbers this file knows
        return False
    libc = _libc_without_new_privileges()
    if libc is None:
        return False
    abi = libc.syscall(create, None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # LANDLOCK_CREATE_RULESET_VERSION
    if abi < 1:
        return False
    # ABI 1: execute … make_sym (bits 0-12); 2: refer; 3: truncate; 5: ioctl on devices.
    everything = (1 << 13) - 1 | (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0) | (
        1 << 15 if abi >= 5 else 0)
    read = 1 | 4 | 8  # execute, read a file, read a directory
    # struct landlock_ruleset_attr: handled_access_fs, handled_access_net (ABI 4), scoped
    # (ABI 6), each a u64; the kernel takes the size of the fields its ABI knows. TCP bind
    # and connect are handled with no rule that allows them: refused. Scoped: no abstract
    # Unix socket outside this process's domain, and no signal to a process outside it
    # (kill and its relatives, and the SIGIO/SIGURG of a file's owner).
    net = 1 | 2 if abi >= 4 else 0  # LANDLOCK_ACCESS_NET_BIND_TCP, _CONNECT_TCP
    scoped = 1 | 2 if abi >= 6 else 0  # LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET, _SIGNAL
    attr = struct.pack("=QQQ", everything, net, scoped)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = libc.syscall(create, buf, ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return False
    try:
        def allow(path, access):
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                return
            try:
                if not os.path.isdir(path):  # a file takes only a file's rights
                    access &= everything & (1 | 2 | 4 | 1 << 14 | 1 << 15)
                rule = ctypes.create_string_buffer(struct.pack("=Qi", access, fd), 12)
                libc.syscall(add_rule, ruleset, 1, rule, ctypes.c_uint32(0))  # LANDLOCK_RULE_PATH_BENEATH
            finally:
                os.close(fd)

        for root in list_roots:
            allow(root, 8)  # read a directory: its names, not its files
        for root in read_roots:
            allow(root, read)
        for root in (f"/proc/{os.getpid()}", "/proc/cpuinfo", "/proc/meminfo", "/sys/devices/system/cpu",
                     "/etc/ld.so.cache"):
            allow(root, read)
        for root in write_roots:
            allow(root, everything)
        return libc.syscall(restrict_self, ruleset, ctypes.c_uint32(0)) == 0
    finally:
        os.close(ruleset)


# A result whose class defines one of these could pass for a number or an array: refused.
COMPARISON_HOOKS = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__array__",
                    "__array_ufunc__", "__array_function__", "__array_interface__", "__array_struct__",
                    "__float__", "__int__", "__index__", "__bool__", "__complex__")
CODE_OBJECTS = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                types.MethodWrapperType, types.WrapperDescriptorType)


def _guard(read_roots, write_roots, report, walled=False):
    """Defence in depth (the real walls are the process boundary, the kernel's seccomp
    filter and the mount namespace): no files outside the given folders, no processes,
    sockets or native libraries. With the seccomp wall up (``walled``), modules that
    only wrap what the kernel now refuses may be imported (SciPy imports subprocess)."""
    denied_modules = {"torch", "transformers", "safetensors", "ctypes", "_ctypes", "socket", "_socket",
                      "multiprocessing", "pty", "resource"}
    if not walled:
        # gc stays importable (an honest gc.collect()): its object walks are refused below.
        denied_modules |= {"subprocess", "_posixsubprocess"}
    denied_events = ("os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                     "os.forkpty", "socket.", "ctypes.", "os.kill", "os.killpg", "os.chown", "sys.addaudithook",
                     "os.setuid", "os.setgid", "sys._current_frames", "gc.get_objects", "gc.get_referrers", "gc.get_referents")
    path_events = {"os.remove", "os.rename", "os.rmdir", "os.unlink", "os.chmod", "os.truncate", "os.mkdir",
                   "shutil.rmtree", "shutil.copyfile", "shutil.move", "os.symlink", "os.link"}
    sep, realpath, fsdecode = os.sep, os.path.realpath, os.fsdecode
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def inside(path, roots):
        return any(path == r or path.startswith(r + sep) for r in roots)

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            if isinstance(path, int):
                return
            p = realpath(fsdecode(path))
            writing = bool(flags & write_flags) if flags else any(c in (mode or "") for c in "wax+")
            if p.startswith("/proc/"):
                if writing or not (p.startswith("/proc/self/") or p in ("/proc/cpuinfo", "/proc/meminfo")):
                    report(f"opened {p}")
                    raise PermissionError(f"the grader's sandbox does not allow opening {p}")
                return
            if not inside(p, write_roots if writing else read_roots):
                report(f"{'wrote' if writing else 'read'} {p}")
                raise PermissionError(f"the grader's sandbox does not allow {'writing' if writing else 'reading'} {p}")
        elif event == "import":
            name = args[0] or ""
            if name.split(".")[0] in denied_modules:
                report(f"imported {name}")
                raise ImportError(f"the grader's sandbox does not allow importing {name}")
        elif event in path_events:
            paths = [a for a in args if isinstance(a, (str, bytes, os.PathLike))]
            if not all(inside(realpath(fsdecode(a)), write_roots) for a in paths):
                report(f"called {event} on {', '.join(map(str, paths))[:200]}")
                raise PermissionError(f"the grader's sandbox does not allow {event} outside its scratch folder")
        elif event.startswith(denied_events):
            report(f"called {event}")
            raise PermissionError(f"the grader's sandbox does not allow {event}")

    sys.addaudithook(hook)


def _warning(record):
    """A recorded warning as plain data: its category as the builtin class it derives from
    (NumPy's own are RuntimeWarning or UserWarning underneath), and its message's start."""
    kind = record.category if isinstance(record.category, type) else UserWarning
    base = next((c.__name__ for c in kind.__mro__ if c.__module__ == "builtins" and issubclass(c, Warning)),
                "UserWarning")
    try:
        text = str(record.message)[:500]
    except BaseException:  # noqa: BLE001
        text = "(the warning's message could not be shown)"
    return [base, text]


class Callback:
    """A function of the test process that the tests passed to lab code: calling it asks
    the test process to run it (on plain data) and waits for its answer."""

    def __init__(self, server, key):
        self._server, self._key = server, key

    def __call__(self, *args, **kwargs):
        return self._server.call_back(self._key, list(args), kwargs)


class Server:
    def __init__(self, sock, wire, np, impl_root, student_path):
        self.sock, self.wire, self.np = sock, wire, np
        self.reader = wire.Reader(sock)
        self.impl_root, self.student_path = impl_root, student_path
        self.objects, self.ids = {}, {}  # handle → object, id(object) → handle
        self.next_handle = 1
        self.generators, self.gen_ref, self.gen_sent = {}, {}, {}  # ref → Generator, id → ref, ref → state
        self.next_gen = -1  # generators made here get negative numbers
        self.blocked = []
        self.test, self.test_cpu0, self.budget = None, 0.0, None
        self.warned = []  # [category, message] of the warnings of the request being answered

    # -- values ---------------------------------------------------------------------------
    def _other(self, value, enc):
        np, wire = self.np, self.wire
        if type(value) is np.random.Generator:
            ref = self.gen_ref.get(id(value))
            if ref is None:
                ref, self.next_gen = self.next_gen, self.next_gen - 1
                self.generators[ref], self.gen_ref[id(value)] = value, ref
            state = wire.generator_state(value)
            self.gen_sent[ref] = state
            return {"$g": [ref, enc(state)]}
        if isinstance(value, np.ndarray):
            raise wire.WireError(f"an ndarray subclass ({wire.type_name(value)}): return a plain np.ndarray "
                                 "(np.asarray(x) turns one into it)")
        if isinstance(value, np.generic):
            raise wire.WireError(f"a NumPy scalar of type {wire.type_name(value)}")
        if not isinstance(value, CODE_OBJECTS):
            t = type(value)
            hooks = [h for h in COMPARISON_HOOKS if getattr(t, h, None) is not getattr(object, h, None)]
            if hasattr(t, "__dataclass_fields__"):  # a dataclass's generated comparisons compare fields: fine
                hooks = [h for h in hooks if h not in ("__eq__", "__lt__", "__le__", "__gt__", "__ge__")]
            if hooks:
                raise wire.WireError(f"an object of type {wire.type_name(value)}, which defines its own "
                                     f"{', '.join(hooks[:3])}: the tests take NumPy arrays and plain Python values "
                                     "(numbers, strings, lists, tuples, dicts)")
        key = id(value)
        h = self.ids.get(key)
        if h is None:
            h, self.next_handle = self.next_handle, self.next_handle + 1
            self.objects[h], self.ids[key] = value, h
        return {"$h": h}

    def _handle(self, h):
        try:
            return self.objects[h]
        except KeyError:
            raise self.wire.WireError(f"handle {h} names no object (it was released)") from None

    def _generator(self, g):
        gen = self.generators.get(g.ref)
        if gen is None:
            gen = self.wire.make_generator(g.state)
            self.generators[g.ref], self.gen_ref[id(gen)] = gen, g.ref
        else:
            gen.bit_generator.state = g.state
        self.gen_sent[g.ref] = g.state
        return gen

    # -- requests -------------------------------------------------------------------------
    def serve(self, until_callback_answer=False):
        """Answer requests; inside a callback, until the test process answers it."""
        wire = self.wire
        while True:
            try:
                tree = self.reader.header()
            except EOFError:
                if until_callback_answer:
                    raise
                return
            dec = wire.Decoder(self.reader.read_into, self._handle, self._generator,
                               callback=lambda key: Callback(self, key))
            try:
                if not (isinstance(tree, list) and len(tree) == 3 and isinstance(tree[0], str)
                        and isinstance(tree[1], dict)):
                    raise wire.WireError("a message without its envelope")
                kind, meta, payload = tree[0], tree[1], dec(tree[2])
                if not isinstance(payload, dict):
                    raise wire.WireError("a request that is not a dict")
            except wire.WireError as exc:
                self._reply({"e": {"type": "WireError", "args": [str(exc)], "msg": str(exc)}}, [])
                continue
            if kind == "cbr":
                if until_callback_answer:
                    return payload
                continue
            self._answer(kind, meta, payload, dec.arrays)

    def call_back(self, key, args, kwargs):
        enc = self.wire.Encoder(self._other)
        self.wire.send(self.sock, ["cb", {}, enc({"cb": key, "args": args, "kwargs": kwargs})], enc.buffers)
        answer = self.serve(until_callback_answer=True)
        if isinstance(answer, dict) and "e" in answer:
            err = answer["e"] if isinstance(answer["e"], dict) else {}
            kind = {"ValueError": ValueError, "TypeError": TypeError, "IndexError": IndexError,
                    "KeyError": KeyError, "StopIteration": StopIteration}.get(err.get("type"), RuntimeError)
            raise kind(str(err.get("msg", "the test's function failed")))
        return answer.get("v") if isinstance(answer, dict) else None

    def _answer(self, op, meta, req, args_arrays):
        np, wire = self.np, self.wire
        for h in meta.get("release", ()):
            obj = self.objects.pop(h, None) if type(h) is int else None
            if obj is not None:
                self.ids.pop(id(obj), None)
        for ref in meta.get("drop", ()):
            gen = self.generators.pop(ref, None)
            self.gen_sent.pop(ref, None)
            if gen is not None:
                self.gen_ref.pop(id(gen), None)
        for ref, state in req.get("sync", {}).items():
            gen = self.generators.get(ref)
            if gen is not None:
                gen.bit_generator.state = state
                self.gen_sent[ref] = state
        if meta.get("test") != self.test:
            self.test, self.test_cpu0 = meta.get("test"), time.process_time()
        budget = meta.get("budget")
        self.budget = budget if type(budget) in (int, float) else None
        snapshots = []
        if op == "call":
            snapshots = [a.copy() if a.nbytes <= (64 << 20) else None for a in args_arrays]
        try:
            if self.budget:
                left = max(0.01, self.budget - (time.process_time() - self.test_cpu0))
                signal.setitimer(signal.ITIMER_PROF, left, 0.25)
            # What NumPy and lab code warn goes back with the answer, as it would reach a test
            # that records warnings under `uv run pytest` (lab 12's 0 / 0 in a block of zeros).
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                try:
                    value = self._do(op, req)
                finally:
                    signal.setitimer(signal.ITIMER_PROF, 0)
                    self.warned = [_warning(w) for w in seen[:20]]
        except BaseException as exc:  # noqa: BLE001 - everything lab code raises goes back as data
            self._reply({"e": self._error(exc)}, [])
            return
        reply = {"v": value}
        writeback = []
        for i, (a, before) in enumerate(zip(args_arrays, snapshots)):
            if before is not None and a.shape == before.shape and a.dtype == before.dtype \
                    and a.tobytes() != before.tobytes():
                writeback.append([i, a.copy()])  # by value: the test process holds the old contents
        if writeback:
            reply["w"] = writeback
        same_as = {id(a): i for i, a in enumerate(args_arrays)}
        enc = wire.Encoder(self._other, same_as=same_as, provenance=True)
        try:
            tree = enc(reply)
        except wire.WireError as exc:
            self._reply({"e": {"type": "WireError", "args": [f"your code returned {exc}"],
                               "msg": f"your code returned {exc}"}}, [])
            return
        self._reply(tree, enc.buffers, encoded=True)

    def _reply(self, tree, buffers, encoded=False):
        wire = self.wire
        if not encoded:
            enc = wire.Encoder(self._other)
            tree, buffers = enc(tree), enc.buffers
        extra, meta = {}, {}
        gens = {}
        for ref, gen in self.generators.items():
            state = gen.bit_generator.state
            if state != self.gen_sent.get(ref):
                gens[ref] = state
                self.gen_sent[ref] = state
        if gens:
            enc = wire.Encoder(self._other)
            extra["g"] = enc(gens)
            buffers = buffers + enc.buffers
        if self.blocked:
            meta["b"] = [str(b) for b in self.blocked[:20]]
            del self.blocked[:]
        if self.warned:
            meta["w"], self.warned = self.warned, []
        if extra:
            tree = {"$m": tree["$m"] + [[k, v] for k, v in extra.items()]}
        wire.send(self.sock, ["r", meta, tree], buffers)

    def _do(self, op, req):
        import importlib

        if op == "import":
            # Generated code (an expression of thousands of terms) compiles only with more
            # room than the default recursion limit gives the compiler: as much as it needs
            # while the lab's modules compile, the default again for the code they run.
            limit = sys.getrecursionlimit()
            sys.setrecursionlimit(max(limit, COMPILE_RECURSION))
            try:
                return importlib.import_module(req["module"])
            finally:
                sys.setrecursionlimit(limit)
        target = req.get("target")
        if op == "getattr":
            return getattr(target, req["name"])
        if op == "setattr":
            setattr(target, req["name"], req["value"])
            return None
        if op == "call":
            return target(*req.get("args", ()), **req.get("kwargs", {}))
        if op == "getitem":
            return target[req["key"]]
        if op == "setitem":
            target[req["key"]] = req["value"]
            return None
        if op == "len":
            return len(target)
        if op == "list":
            return list(target)
        if op == "next":
            return next(target)
        if op == "describe":
            return {"type": type(target).__name__, "repr": repr(target)[:300]}
        raise ValueError(f"unknown request {op!r}")

    def _error(self, exc):
        args = [a for a in exc.args if a is None or type(a) in (str, int, float, bool)]
        if len(args) != len(exc.args):
            args = [str(exc)]
        # What lab code raises reaches the test process's log and messages: never more than a message's worth.
        args = [a[:2000] if type(a) is str else a for a in args]
        try:
            msg = str(exc)
        except BaseException:  # noqa: BLE001
            msg = "(the exception's message could not be shown)"
        kind = type(exc)
        base = next((c.__name__ for c in kind.__mro__ if c.__module__ == "builtins"), "Exception")
        where, line = "", None
        for fr in traceback.extract_tb(exc.__traceback__):
            if fr.filename.startswith(self.student_path):
                where, line = self._as_student_path(fr.filename) + f" line {fr.lineno}", fr.lineno
        if isinstance(exc, SyntaxError) and exc.filename:
            line = exc.lineno if type(exc.lineno) is int else None
            where = self._as_student_path(exc.filename) + (f" line {line}" if line else "")
        if isinstance(exc, TestTimeLimit):
            base = "TestTimeLimit"
        return {"type": kind.__name__ if kind.__module__ == "builtins" else base,
                "name": kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}",
                "args": args[:4], "msg": msg[:2000], "where": where, "line": line}

    def _as_student_path(self, filename):
        """impl/<lab>/<lab k>/<module>.py → labs/<lab k>/src/<module>.py"""
        parts = filename[len(self.student_path):].strip("/").split("/")
        if len(parts) >= 2 and parts[-1].endswith(".py"):
            return f"labs/{parts[-2]}/src/{parts[-1]}"
        return filename


def _load(walled):
    """What every lab process needs, imported before any lab code runs."""
    import numpy as np
    import numpy.random  # noqa: F401 - now, before lab code can change what importing it finds

    if not walled:
        # Without the kernel's wall the audit hook must refuse subprocess and gc, which
        # importing SciPy needs: a lab that may use scipy.special (its rubric says) gets
        # it now. With the wall, it is imported when lab code asks (a quarter second of
        # CPU that most labs never need).
        try:
            import scipy.special  # noqa: F401
        except ImportError:
            pass

    import gptkit
    from gptkit.testing import wire

    # The wire that encodes this process's answers (and says where each array lives, which
    # the tests' same_object and shares_memory trust) is this one, held by the server
    # alone: out of sys.modules and off the package, so lab code that imports
    # gptkit.testing gets a fresh copy of its own, and patching that copy changes nothing
    # here.
    for name in [n for n in sys.modules if n == "gptkit.testing" or n.startswith("gptkit.testing.")]:
        del sys.modules[name]
    gptkit.__dict__.pop("testing", None)
    return np, wire


def _enter_home(home):
    """The lab process's own scratch folder: its HOME, TMPDIR and working folder."""
    if home:
        os.environ["HOME"] = os.environ["TMPDIR"] = home
        os.chdir(home)
        if "tempfile" in sys.modules:
            sys.modules["tempfile"].tempdir = None


def _empty_home(home):
    """Before the zygote forks a lab process: the scratch folder it shares with the lab
    processes forked before (its own /tmp, one at a time) is emptied, all but the folders
    the grader bound there (another file system, read-only); never forks into a folder it
    could not empty."""
    dev = os.lstat(home).st_dev

    def entries(folder):
        try:
            return list(os.scandir(folder))
        except PermissionError:
            os.chmod(folder, 0o700)
            return list(os.scandir(folder))

    def clear(folder):
        kept = False
        for entry in entries(folder):
            st = entry.stat(follow_symlinks=False)
            if st.st_dev != dev:
                kept = True  # a folder the grader bound here: not the lab code's
            elif entry.is_dir(follow_symlinks=False):
                if clear(entry.path):
                    kept = True
                else:
                    os.rmdir(entry.path)
            else:
                os.unlink(entry.path)
        return kept

    clear(home)


def _serve_lab(sock, config, walled, np, wire):
    """Become the lab's process: the file fence and the audit hook, then answer requests
    until the test process hangs up. Never returns."""
    sys.path[:0] = config["sys_path"]
    os.umask(0o022)
    _enter_home(config.get("home"))
    signal.signal(signal.SIGPROF, _on_prof)
    blocked = []

    def report(what):
        if len(blocked) < 100:
            blocked.append(what)

    server = Server(sock, wire, np, config["impl"], config["student_path"])
    server.blocked = blocked
    fenced = _files_fence(config["read_roots"], config["write_roots"], [p for p in sys.path if os.path.isdir(p)])
    if config.get("needs_walls") and not (walled and fenced):
        os._exit(70)  # forked by the zygote, it shares one sandbox with the other labs: never without both
    _guard(config["read_roots"], config["write_roots"], report, walled)
    sys.stdin.close()
    gc.freeze()
    gc.enable()
    wire.send(sock, ["ready", {}, None], [])  # start-up done: from here on, CPU time is the lab code's
    server.serve()
    os._exit(0)


def _read_config(arg):
    """The configuration, as JSON: the grader writes it into a pipe whose read end is
    ``arg`` (a descriptor number: no file that lab code could replace); a path is read
    as a file (tests that start this file by hand)."""
    with (os.fdopen(int(arg), "rb") if arg.isdigit() else open(arg, "rb")) as fh:
        return json.loads(fh.read())


def main():
    # No cyclic collections while NumPy and the rest load (a tenth of their import time),
    # and none of what they loaded is looked at again: it is frozen before lab code runs.
    gc.disable()
    if sys.argv[1] == "--walls":  # exit code 0: this machine has both kernel walls
        os._exit(0 if _no_new_processes() and _files_fence(["/"], []) else 1)
    if sys.argv[1] == "--namespaces":  # exit code 0: a lab process here gets namespaces of its own
        os._exit(0 if _own_namespaces() else 1)
    if sys.argv[1] == "--zygote":
        _zygote(int(sys.argv[2]), sys.argv[3])
    fd = int(sys.argv[1])
    config = _read_config(sys.argv[2])
    sock = socket.socket(fileno=fd)
    if config.get("own_namespaces") and not _own_namespaces():
        os._exit(71)  # the grader found that this machine gives them: never without
    walled = _no_new_processes()  # first: every thread started from here on inherits it
    sys.path[:0] = config["sys_path"]
    np, wire = _load(walled)
    del sys.path[:len(config["sys_path"])]
    _serve_lab(sock, config, walled, np, wire)


# -- the zygote ------------------------------------------------------------------------------
# One per submission, started by the grader in a sandbox that holds every lab's tree: it
# loads NumPy once and forks each lab's process, which then puts up its own walls (the
# seccomp filter, and a Landlock fence that lets it read its own lab's tree only). It
# never runs lab code itself and never holds the token or the tests. The grader uses it
# only where the kernel has both walls; elsewhere each lab's process is started alone in
# a sandbox of its own.

def proc_cpu(pid) -> float | None:
    """CPU seconds of a process and of its children it has reaped (``/proc/<pid>/stat``:
    utime, stime, cutime, cstime); None when it is gone. The grader's count too."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return sum(int(fields[i]) for i in (11, 12, 13, 14)) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def proc_peak_kb(pid) -> int | None:
    """A process's peak resident memory so far (``/proc/<pid>/status``: VmHWM) in KiB; None
    when it is gone. Read from outside the process, so that lab code cannot change what a
    test that measures memory sees (lab 12)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def end_process(pid, grace, kill) -> dict:
    """Give a child of this process ``grace`` seconds to end by itself, else ``kill(pid)``
    it, and reap it: its ``exit`` code (-1 if none), ``signal`` (0 if none), whether it was
    ``ended_by_grader``, and its ``cpu`` seconds (rusage). Used by the zygote and the grader."""
    deadline = time.monotonic() + grace
    done = 0
    while not done and time.monotonic() < deadline:
        done, st, usage = os.wait4(pid, os.WNOHANG)
        if not done:
            time.sleep(0.01)
    if not done:
        kill(pid)
        _, st, usage = os.wait4(pid, 0)
    return {"exit": os.WEXITSTATUS(st) if os.WIFEXITED(st) else -1,
            "signal": os.WTERMSIG(st) if os.WIFSIGNALED(st) else 0, "ended_by_grader": not done,
            "cpu": usage.ru_utime + usage.ru_stime, "maxrss_kb": usage.ru_maxrss}


def _zygote(ctl_fd, config_path):
    """Requests, one JSON message each on the grader's SOCK_SEQPACKET socket:
    ``spawn`` (with the lab's socket and log file as passed descriptors; its ``config``)
    → ``pid``; ``cpu`` → its CPU seconds so far; ``end`` (after ``grace`` seconds to end
    by itself) → its exit status and CPU seconds."""
    ctl = socket.socket(fileno=ctl_fd)
    base = _read_config(config_path)
    sys.path[:0] = base["sys_path"]
    os.umask(0o022)
    np, wire = _load(walled=True)
    del sys.path[:len(base["sys_path"])]
    gc.collect()
    gc.freeze()
    ctl.send(json.dumps({"ready": True}).encode())
    cpu_at_end = {}
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(ctl, 1 << 20, 2)
        except OSError:
            data, fds = b"", []
        if not data:
            os._exit(0)
        try:
            req = json.loads(data)
            op = req["op"]
            if op == "spawn":
                lab_sock, log = fds
                if req["config"].get("empty_home"):
                    _empty_home(req["config"]["home"])
                pid = os.fork()
                if pid == 0:
                    try:
                        ctl.close()
                        os.setsid()
                        os.dup2(log, 1)
                        os.dup2(log, 2)
                        os.close(log)
                        if req["config"].get("own_namespaces") and not _own_namespaces():
                            os._exit(71)
                        walled = _no_new_processes()
                        _serve_lab(socket.socket(fileno=lab_sock), {**req["config"], "needs_walls": True},
                                   walled, np, wire)
                    finally:
                        os._exit(70)
                reply = {"pid": pid}
            elif op == "cpu":
                pid = int(req["pid"])
                reply = {"cpu": cpu_at_end[pid] if pid in cpu_at_end else proc_cpu(pid) or 0.0}
            elif op == "memory":
                reply = {"peak_kb": proc_peak_kb(int(req["pid"]))}
            elif op == "end":
                pid = int(req["pid"])
                before = proc_cpu(pid) or 0.0
                reply = end_process(pid, min(2.0, float(req.get("grace", 0))), lambda p: os.kill(p, signal.SIGKILL))
                reply["cpu"] = cpu_at_end[pid] = max(before, reply["cpu"])
            else:
                reply = {"error": f"unknown request {op!r}"}
        except Exception as exc:  # noqa: BLE001 - the grader gets the reason
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
        ctl.send(json.dumps(reply).encode())


if __name__ == "__main__":
    main()
