"""
How a script stops when it is told to: Ctrl-C raises KeyboardInterrupt, and here SIGTERM (`timeout`,
`docker stop`, a job scheduler) and a hang-up (SIGHUP: the terminal or ssh session went away) raise it too
(Terminated), so that one `except KeyboardInterrupt` stops a script with one line, cleaning up as it goes,
whichever of the three came. train.py's StopRequest, during training, turns them into a save instead.
"""
import signal


class Terminated(KeyboardInterrupt):
    """SIGTERM (`timeout`, `docker stop`, a job scheduler), or a hang-up (SIGHUP), raised as Ctrl-C's
    KeyboardInterrupt is: see interrupt_on_sigterm. signum: which."""

    def __init__(self, signum=signal.SIGTERM):
        super().__init__()
        self.signum = signal.Signals(signum)


def interrupt_on_sigterm():
    """From now on SIGTERM raises Terminated where it would end the process at once, so that code which stops
    on Ctrl-C with one line, cleaning up as it goes (a half-written file, a lock), stops so on SIGTERM too.
    Returns the handler it replaced, for the caller to put back."""
    return signal.signal(signal.SIGTERM, _raise_terminated)


def interrupt_on_hang_up():
    """As interrupt_on_sigterm, for a hang-up (SIGHUP: the terminal or ssh session that started the process went
    away), unless it is ignored (nohup, which means the process to outlive the terminal). Returns the handler it
    replaced, or None where it left the one there."""
    if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        return None
    return signal.signal(signal.SIGHUP, _raise_terminated)


def _raise_terminated(signum, frame):
    raise Terminated(signum)


def interrupted_by(error):
    """The signal a KeyboardInterrupt stands for: Terminated's own, else Ctrl-C's SIGINT. The process is on its
    way out then, so where SIGTERM or SIGHUP interrupts (interrupt_on_sigterm), a later one is ignored from here
    on: it would break into the clean-up with a traceback."""
    for s in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(s) is _raise_terminated:
            signal.signal(s, signal.SIG_IGN)
    return error.signum if isinstance(error, Terminated) else signal.SIGINT
