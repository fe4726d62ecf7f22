"""The watchdog of a server tied to the process that started it (``process.spawn(tied=True)``).

Run as a script, stdlib only: ``python -I -S watchdog.py FD [--users PATH] [--leftover PATH]...
CMD...``. It forks CMD into its own process group (the watchdog's), exits with CMD's status
when CMD ends (first removing each ``--leftover`` file or folder: what the server leaves
behind, e.g. SeaweedFS's sockets and logs), and
when FD, the read end of a pipe whose write end only the starting process holds, reaches
end-of-file (that process is gone, however it died: exit, SIGTERM, kill -9) it sends SIGTERM
to the group, then SIGKILL after 10 s. With ``--users PATH`` it first waits until no process
holds a shared flock on PATH any more (other runs still using the server; the kernel drops
their locks when they die, also on kill -9), holding it exclusively while it stops the server. It ignores SIGTERM and SIGINT itself, so ``killpg(pid, SIGTERM)`` (fedapt's
stop) stops the server first and the watchdog follows it.

Why a pipe and not prctl(PR_SET_PDEATHSIG) in a preexec_fn: the parent-death signal fires
when the *thread* that started the child ends (a server started from a worker thread would
be killed with that thread), and it reaches only the direct child, not the processes a server
starts itself; end-of-file on a pipe means exactly "every copy of the write end is closed".
"""

import contextlib
import fcntl
import os
import select
import shutil
import signal
import sys
import time


def main() -> None:
    fd = int(sys.argv[1])
    cmd = sys.argv[2:]
    users = None
    if cmd[:1] == ["--users"]:
        users, cmd = cmd[1], cmd[2:]
    leftovers = []
    while cmd[:1] == ["--leftover"]:
        leftovers.append(cmd[1])
        cmd = cmd[2:]
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    pid = os.fork()
    if pid == 0:
        os.close(fd)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        try:
            os.execv(cmd[0], cmd)
        finally:
            os._exit(127)

    def reap() -> None:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            for path in leftovers:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                elif os.path.lexists(path):
                    with contextlib.suppress(OSError):
                        os.unlink(path)
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)

    while True:
        ready = select.select([fd], [], [], 0.5)[0]
        reap()
        if ready and not os.read(fd, 1):
            break  # the process that started the server is gone
    if users is not None:  # wait for the last run that uses the server
        # A raw flock, not flows.services.process.flock_fd: this script runs with -I -S
        # (stdlib only, no site-packages, not even its own folder on sys.path).
        lock = os.open(users, os.O_RDWR | os.O_CREAT, 0o644)
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                reap()
                time.sleep(0.5)
    os.killpg(0, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        reap()
        time.sleep(0.1)
    os.killpg(0, signal.SIGKILL)


if __name__ == "__main__":
    main()
