import os
import signal
import threading
import warnings
from pathlib import Path

import pytest
import torch
from fixtures_runs import TINY, train_tiny_runs

TINY_ENCODINGS = ("sa-quadratic", "sa-quadratic-aniso", "sa-learned", "sa-learned-content")

# Two pytest-xdist workers on two cores: one intra-op thread each avoids oversubscription.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _sigint_state() -> str | None:
    """What is wrong with this process's Ctrl-C, or None: SIGINT must reach Python's default handler (tests send
    themselves SIGINT and expect a KeyboardInterrupt). Python's handler, and the kernel's view of the main thread:
    SIGINT blocked, ignored, or not caught (a library's own sigaction in place of Python's)."""
    handler = signal.getsignal(signal.SIGINT)
    if handler is not signal.default_int_handler:
        return f"the SIGINT handler is {handler!r}"
    try:
        fields = dict(line.split(":\t", 1) for line in Path(f"/proc/self/task/{os.getpid()}/status").read_text()
                      .splitlines() if line.startswith(("SigBlk", "SigIgn", "SigCgt")))
    except (OSError, ValueError):
        return None
    bit = 1 << (signal.SIGINT - 1)
    blocked, ignored, caught = (int(fields.get(k, "0"), 16) & bit for k in ("SigBlk", "SigIgn", "SigCgt"))
    if blocked or ignored or not caught:
        return f"SIGINT is {'blocked' if blocked else 'ignored' if ignored else 'not caught'} by the kernel"
    return None


@pytest.fixture(autouse=True)
def _ctrl_c_reaches_python(request):
    """A test that leaves Ctrl-C changed (a handler not put back) is named in a warning, and Python's default is
    put back for the tests after it: three tests that send themselves SIGINT once failed together on one worker
    (`DID NOT RAISE KeyboardInterrupt`) after some earlier test there had changed it."""
    yield
    if threading.current_thread() is not threading.main_thread():
        return
    wrong = _sigint_state()
    if wrong is not None:
        warnings.warn(f"{request.node.nodeid} left Ctrl-C changed ({wrong}); Python's default is put back",
                      stacklevel=1)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def tiny_attention_runs(tmp_path_factory):
    """Tiny 2-step runs of every attention encoding (7x7 token grid), and their 12-image test set on disk."""
    runs = train_tiny_runs(tmp_path_factory.mktemp("tiny-runs"), ((m, TINY) for m in TINY_ENCODINGS),
                           epochs=1, max_steps=2)
    del runs["data"]
    return runs


@pytest.fixture
def memory_asked(monkeypatch):
    """Called (after the layers are built: their constructors check memory too), the list of the bytes each
    `SelfAttention2d` forward's memory check asks for from then on; every check refuses (the machine is said to hold
    one byte), so a forward stops at its check with what it counted recorded."""
    import attnconv.limits as limits

    def record() -> list[float]:
        asked: list[float] = []
        monkeypatch.setattr(limits, "physical_memory", lambda: 1)
        real = limits.check_memory
        monkeypatch.setattr("attnconv.attention.layer.check_memory",
                            lambda need, *a, **k: asked.append(need) or real(need, *a, **k))
        return asked

    return record
