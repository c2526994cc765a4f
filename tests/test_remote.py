"""The remote layer's own rules: quoting, LC_ALL=C, timeouts, masking, the fan-out's reporting."""
from __future__ import annotations

import io
import logging
import shlex
from pathlib import Path

import paramiko
import pytest
from rich.console import Console

from provision import inventory, plan, remote, report, secrets
from provision.errors import ProvisionError, UnreachableHost
from provision.fanout import for_each_host
from provision.runner import command_line


def test_command_is_quoted_once_and_runs_in_the_c_locale() -> None:
    line = command_line(["echo", "a b", "$(reboot)", "it's"], env={"X": "1 2"})
    assert shlex.split(line) == ["env", "LC_ALL=C", "LANG=C", "X=1 2", "echo", "a b", "$(reboot)",
                                 "it's"]


def test_local_runner_runs_for_real_and_reports_exit_codes() -> None:
    runner = remote.connect(inventory.local_host(), inventory.SshSettings())
    done = runner.run(["python3", "-c",
                       "import os, sys; print(os.environ.get('LC_ALL', ''), end=''); sys.exit(3)"])
    assert (done.exited, done.stdout, done.ok) == (3, "C", False)
    piped = runner.run(["cat"], stdin="x" * 100_000)
    assert piped.stdout == "x" * 100_000
    assert runner.executions == 2


def test_local_runner_timeout_is_a_result_not_a_hang() -> None:
    runner = remote.connect(inventory.local_host(), inventory.SshSettings())
    done = runner.run(["sleep", "10"], timeout=0.5)
    assert done.timed_out and not done.ok and done.seconds < 5


def test_secrets_are_masked_in_every_log_line(caplog: pytest.LogCaptureFixture) -> None:
    secret = "hf_abcdefghijklmnopqrstuvwxyz012345"
    secrets.register_secret(secret)
    logger = logging.getLogger("provision.test")
    caplog.handler.addFilter(secrets.MaskingFilter())
    with caplog.at_level(logging.DEBUG, logger="provision"):
        logger.warning("token is %s and again %s", secret, secret)
    assert secret not in caplog.text and secrets.MASK in caplog.text
    assert secrets.mask(f"Authorization: Bearer {secret}") == f"Authorization: Bearer {secrets.MASK}"


def test_fan_out_reports_every_host_even_when_some_fail() -> None:
    def work(name: str) -> str:
        if name == "b":
            raise UnreachableHost(name, "no route to host")
        return name.upper()

    results = for_each_host(["a", "b", "c"], lambda name: name, work)
    assert results.order == ("a", "b", "c")
    assert dict(results.values) == {"a": "A", "c": "C"}
    assert "no route" in str(results.errors["b"]) and not results.ok


def test_unreachable_address_is_a_clear_error_within_the_connect_timeout() -> None:
    host = inventory.Host(name="gone", address="127.0.0.1", port=1, user="root",
                          profile=inventory.local_host().profile, connection="ssh", key_file=None,
                          vars={}, source="test")
    runner = remote.connect(host, inventory.SshSettings(connect_timeout=2))
    with pytest.raises(UnreachableHost, match=r"gone: unreachable: cannot connect to root@127.0.0.1:1") as caught:
        runner.run(["true"])
    assert caught.value.__cause__ is not None  # paramiko's own error, for --verbose


def test_an_error_names_its_host_once() -> None:
    inner = UnreachableHost("cpu-1", "cannot connect to root@10.0.0.5:22: connection refused")
    assert str(UnreachableHost("cpu-1", str(inner))) == str(inner)
    assert str(inner) == "cpu-1: unreachable: cannot connect to root@10.0.0.5:22: connection refused"
    out = Console(file=io.StringIO(), width=200)
    report.print_check(["cpu-1"], {}, {"cpu-1": inner}, out)
    shown = out.file.getvalue()  # type: ignore[attr-defined]
    assert shown.startswith("cpu-1: unreachable: cannot connect") and "cpu-1: cpu-1" not in shown
    assert report.host_error("cpu-1", inner) == str(inner)
    assert report.host_error("cpu-1", ProvisionError("no facts")) == "cpu-1: no facts"


def test_a_connection_dropped_without_a_reason_says_what_happened() -> None:
    """paramiko's SFTP raises 'Server connection dropped: ' with nothing after the colon."""

    class Dropping:
        is_connected = True

        def sftp(self) -> None:
            raise paramiko.SSHException("Server connection dropped: ")

        def close(self) -> None:
            pass

    host = inventory.Host(name="cpu-1", address="10.0.0.5", port=22, user="root",
                          profile=inventory.local_host().profile, connection="ssh", key_file=None,
                          vars={}, source="test")
    runner = remote.SshRunner(host, inventory.SshSettings(known_hosts="/nonexistent/known_hosts"))
    runner.connection = Dropping()  # type: ignore[assignment]
    with pytest.raises(UnreachableHost) as raised:
        runner.put(Path(__file__), "/tmp/x")
    message = str(raised.value)
    assert message.startswith("cpu-1: unreachable: copy of test_remote.py to /tmp/x failed: Server connection "
                              "dropped: the host closed the connection without giving a reason")
    assert remote.in_words(EOFError()).startswith("EOFError: the host closed the connection")
    assert remote.in_words(OSError("Socket is closed")) == "Socket is closed"


def test_a_weights_run_with_nothing_to_do_speaks_of_the_weights() -> None:
    assert plan.summary([], "weights") == "no changes: the weights are as verified"
    assert plan.summary([], "venv") == "no changes: the venv is as resolved"
    assert plan.summary([]) == "no changes: files, user, directories and units are as rendered"


def test_a_ctrl_c_during_a_local_command_ends_the_command_and_is_raised_again() -> None:
    """Invoke hands a Ctrl-C to the child as \\x03 on its stdin and waits on: a child that reads no more
    stdin ran to its end and the interrupt was lost (a watch on this machine never stopped)."""
    import os
    import signal
    import sys
    import threading
    import time
    from types import SimpleNamespace

    runner = remote.LocalRunner(SimpleNamespace(name="local"), 30)  # only the name is read
    # Python's own Ctrl-C handler, also where the suite was started in the background (a shell starts
    # `cmd &` with SIGINT ignored, and Python then installs none).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            runner.run([sys.executable, "-c", "import time; time.sleep(20)"])
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - started < 10  # the child was ended, not waited for
    assert runner.run([sys.executable, "-c", "print('next')"]).stdout == "next\n"  # the next run is its own
