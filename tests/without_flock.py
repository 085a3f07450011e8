"""`python tests/without_flock.py PROGRAM ARGS...`: runs PROGRAM (a path) with ARGS in a process where flock(2) fails
with ENOLCK ("No locks available"), as it does on a filesystem without locks (NFS without its lock daemon, Lustre
mounted without -o flock). A seccomp filter of the kernel's refuses the system call; it holds for the process and
every process it starts (train.py's supervised child), and nothing else changes."""
import ctypes
import errno
import os
import platform
import struct
import sys

_FLOCK = {"x86_64": 73, "aarch64": 32}  # flock's system call number
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_LOAD_WORD, _JUMP_IF_EQUAL, _RETURN = 0x20, 0x15, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO


class _Program(ctypes.Structure):
  _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def refuse_flock() -> None:
  machine = platform.machine()
  op = lambda code, if_true, if_false, k: struct.pack("HBBI", code, if_true, if_false, k)
  program = b"".join([
      op(_LOAD_WORD, 0, 0, 4),  # seccomp_data.arch
      op(_JUMP_IF_EQUAL, 1, 0, _AUDIT_ARCH[machine]),
      op(_RETURN, 0, 0, _ALLOW),
      op(_LOAD_WORD, 0, 0, 0),  # seccomp_data.nr
      op(_JUMP_IF_EQUAL, 0, 1, _FLOCK[machine]),
      op(_RETURN, 0, 0, _ERRNO | errno.ENOLCK),
      op(_RETURN, 0, 0, _ALLOW)])
  code = ctypes.create_string_buffer(program)
  libc = ctypes.CDLL(None, use_errno=True)
  filter_ = _Program(len(program) // 8, ctypes.addressof(code))
  if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) or libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER,
                                                                  ctypes.byref(filter_), 0, 0):
    raise OSError(ctypes.get_errno(), "cannot install the seccomp filter")


if __name__ == "__main__":
  refuse_flock()
  os.execv(sys.argv[1], sys.argv[1:])
