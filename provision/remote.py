"""The one module that runs commands on hosts. Everything else gets a `Runner`.

A command is an argv list, quoted once (shlex: `command_line`, provision/runner.py), run with LC_ALL=C
so every parser sees the same output on every host. Two runners:

- `SshRunner`: Fabric/paramiko, strict host-key checking against a known_hosts file. An unknown key is
  refused unless the caller explicitly asked to accept and record new keys; a changed key is always
  refused. Keys from the inventory, else the SSH agent and ~/.ssh/id_*. Connect and command timeouts.
  One connection per host for all its commands; each command is one SSH session on it (one round trip).
- `LocalRunner`: Invoke's own context on this machine, no SSH.

Secrets (HF token, API key) never travel in argv; they go in stdin or in files. Whatever is logged passes
through `mask()` (provision/secrets.py), which replaces every registered secret.
"""
from __future__ import annotations

import errno
import io
import logging
import select
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import paramiko
from fabric import Config, Connection
from invoke.config import Config as InvokeConfig
from invoke.context import Context as InvokeContext
from invoke.exceptions import CommandTimedOut
from invoke.runners import Local as InvokeLocal

from provision.errors import HostKeyError, UnreachableHost
from provision.runner import Result, Runner, command_line
from provision.secrets import mask

if TYPE_CHECKING:  # typing.Self is 3.11+; this package runs on 3.10
    from typing_extensions import Self
from provision.inventory import Host, SshSettings

log = logging.getLogger("provision.remote")
# paramiko prints its own tracebacks through logging's last-resort handler; our errors say it better.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False

class _WholeStdin:
    """Hand stdin over in one piece.

    Invoke's runners copy stdin one byte per loop with a 10 ms sleep (made for terminals): the
    8 KiB fact probe then took 45 s to send. A StringIO we built is read whole instead. The sleep
    itself stays: at 0 Invoke's loops spin and take the CPU from everything else.
    """

    def read_our_stdin(self, input_: object) -> str | None:
        if isinstance(input_, io.StringIO):
            return input_.read()
        whole: str | None = super().read_our_stdin(input_)  # type: ignore[misc]  # a mixin's super()
        return whole


class _LineStream(io.StringIO):
    """An out_stream for Invoke that hands each complete line to a callback."""

    def __init__(self, on_line: Callable[[str], None]) -> None:
        super().__init__()
        self.on_line = on_line
        self.pending = ""

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            self.on_line(line)
        return len(text)


def _streaming(on_line: Callable[[str], None] | None) -> dict[str, object]:
    """Run options: everything hidden, or stdout streamed line by line to on_line."""
    return {"hide": True} if on_line is None else {"hide": "stderr", "out_stream": _LineStream(on_line)}


class _Local(_WholeStdin, InvokeLocal):
    """Invoke's local runner, but a Ctrl-C is not lost: Invoke hands it to the child as a \\x03 on its
    stdin and goes on waiting, which a child reading no more stdin never sees, so the run returned as
    if nothing happened (`status --watch --host local` kept watching). The child gets SIGINT, as from a
    terminal, and the interrupt is raised again once the child has ended."""

    _interrupt: KeyboardInterrupt | None = None

    def send_interrupt(self, interrupt: KeyboardInterrupt) -> None:
        self._interrupt = interrupt
        process = getattr(self, "process", None)
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)

    def run(self, command: str, **kwargs: Any) -> Any:
        result = super().run(command, **kwargs)
        if self._interrupt is not None:
            raise self._interrupt
        return result

    def stop(self) -> None:
        super().stop()
        # Invoke leaves the child's pipes to the garbage collector; close them now.
        process = getattr(self, "process", None)
        for stream in (getattr(process, "stdout", None), getattr(process, "stderr", None),
                       getattr(process, "stdin", None)):
            if stream is not None:
                stream.close()


class _Counting:
    """Shared bookkeeping: count executions and log each one, masked."""

    host: str
    executions: int

    def _record(self, command: str, exited: int, seconds: float, timed_out: bool) -> None:
        self.executions += 1
        state = "timed out" if timed_out else f"exit {exited}"
        log.debug("%s: %s -> %s in %.2fs", self.host, mask(command), state, seconds)


# ---------------------------------------------------------------------------------------------
# SSH


def in_words(exc: BaseException) -> str:
    """An SSH or socket error's first line, never empty and never ending on a bare colon: paramiko
    raises 'Server connection dropped: ' (nothing after it) when the server just closes the SFTP
    channel, and a plain EOFError has no text at all."""
    lines = str(exc).strip().splitlines()
    text = lines[0].strip() if lines else ""
    if text and not text.endswith(":"):
        return text
    said = text.rstrip(":").strip() or type(exc).__name__
    return (f"{said}: the host closed the connection without giving a reason (sshd or the host "
            "restarting, or something on the network cutting it)")


def _connect_failure(exc: BaseException) -> str:
    """A failed connect in plain words. paramiko folds the socket errors of every address it tried into
    NoValidConnectionsError ('[Errno None] Unable to connect to port 22 on …'): say what they were."""
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) and exc.errors:
        causes = {getattr(error, "errno", None) for error in exc.errors.values()}
        if causes == {errno.ECONNREFUSED}:
            return "connection refused (nothing listens on that port)"
        if causes <= {errno.EHOSTUNREACH, errno.ENETUNREACH}:
            return "no route to the host (down, or a network between)"
        first = next(iter(exc.errors.values()))
        return getattr(first, "strerror", None) or str(first)
    return in_words(exc)


class _StrictHostKeys(paramiko.MissingHostKeyPolicy):
    """Refuse unknown host keys, or (only when asked) accept and record them in known_hosts."""

    def __init__(self, host: str, known_hosts: Path, accept_new: bool) -> None:
        self.host = host
        self.known_hosts = known_hosts
        self.accept_new = accept_new

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        fingerprint = key.fingerprint  # "SHA256:..."
        if not self.accept_new:
            raise HostKeyError(
                self.host,
                f"unknown host key {key.get_name()} {fingerprint} for {hostname} (not in "
                f"{self.known_hosts}); check the fingerprint on the host (ssh-keygen -lf "
                f"/etc/ssh/ssh_host_{key.get_name().replace('ssh-', '')}_key.pub) and run again with "
                "--accept-new-host-keys to record it",
            )
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        with self.known_hosts.open("a", encoding="utf-8") as handle:
            handle.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)
        log.warning("%s: recorded new host key %s %s in %s", self.host, key.get_name(), fingerprint,
                    self.known_hosts)


def known_hosts_name(address: str, port: int) -> str:
    """How OpenSSH writes a host in known_hosts: 'addr' on port 22, '[addr]:port' elsewhere."""
    return address if port == 22 else f"[{address}]:{port}"


DEAD_PEER_SECONDS = 30


def _detect_dead_peer(transport: paramiko.Transport | None, seconds: int) -> None:
    """A host that goes away mid-command must end the command, not hang it for hours: SSH keepalives
    keep bytes in flight, and the kernel drops a connection whose bytes stay unacknowledged for
    `seconds` (TCP_USER_TIMEOUT), or that stays silent through TCP keepalive probes."""
    if transport is None:
        return
    transport.set_keepalive(max(1, seconds // 3))
    sock = transport.sock
    if not isinstance(sock, socket.socket):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", seconds // 3), ("TCP_KEEPINTVL", max(1, seconds // 6)),
                          ("TCP_KEEPCNT", 3), ("TCP_USER_TIMEOUT", seconds * 1000)):
        if hasattr(socket, option):  # Linux; elsewhere the SSH keepalive alone remains
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


class SshRunner(_Counting):
    """One host over SSH (Fabric). Connects lazily, reuses the connection for every command."""

    def __init__(self, host: Host, ssh: SshSettings, *, accept_new_host_keys: bool = False) -> None:
        self.host = host.name
        self.executions = 0
        self.target = host
        self.ssh = ssh
        self.known_hosts = Path(ssh.known_hosts or Path.home() / ".ssh" / "known_hosts")
        key_file = host.key_file or ssh.key_file
        # lazy=True: read no ~/.ssh/config and no invoke config files; the inventory is the one source.
        config = Config(lazy=True, overrides={"load_ssh_configs": False})
        connect_kwargs: dict[str, object] = {
            "look_for_keys": key_file is None,
            "allow_agent": True,
            "banner_timeout": ssh.connect_timeout,
            "auth_timeout": ssh.connect_timeout,
        }
        if key_file:
            connect_kwargs["key_filename"] = [key_file]
        self.connection = Connection(host.address, user=host.user, port=host.port, config=config,
                                     connect_timeout=int(ssh.connect_timeout),
                                     connect_kwargs=connect_kwargs)
        client = self.connection.client
        if self.known_hosts.exists():
            client.load_host_keys(str(self.known_hosts))
        client.set_missing_host_key_policy(
            _StrictHostKeys(host.name, self.known_hosts, accept_new_host_keys))

    def _open(self) -> None:
        if self.connection.is_connected:
            return
        where = f"{self.target.user}@{self.target.address}:{self.target.port}"
        try:
            self.connection.open()
            _detect_dead_peer(self.connection.client.get_transport(), DEAD_PEER_SECONDS)
        except HostKeyError:
            raise
        except paramiko.BadHostKeyException as exc:
            name = known_hosts_name(self.target.address, self.target.port)
            raise HostKeyError(
                self.host,
                f"the host key of {where} CHANGED (now {exc.key.get_name()} {exc.key.fingerprint}); "
                "refused. If the host was reinstalled on purpose, remove the old key with "
                f"`ssh-keygen -R '{name}' -f {self.known_hosts}` and run again with "
                "--accept-new-host-keys",
            ) from exc
        except paramiko.AuthenticationException as exc:
            raise UnreachableHost(self.host, f"authentication failed for {where}: {exc}") from exc
        except TimeoutError as exc:
            raise UnreachableHost(
                self.host, f"no answer from {where} within {self.ssh.connect_timeout:g}s") from exc
        except (OSError, paramiko.SSHException, EOFError) as exc:
            reason = _connect_failure(exc)
            if "No existing session" in reason or "banner" in reason:
                reason = "something answered but no SSH server spoke (is sshd on that port?)"
            raise UnreachableHost(self.host, f"cannot connect to {where}: {reason}") from exc

    def run(self, argv: Sequence[str], *, stdin: str | None = None, timeout: float | None = None,
            env: Mapping[str, str] | None = None, on_line: Callable[[str], None] | None = None) -> Result:
        self._open()
        command = command_line(argv, env)
        started = time.monotonic()
        timeout = timeout or self.ssh.command_timeout
        try:
            exited, out, err, timed_out = _exec(self.connection.client.get_transport(), command, stdin,
                                                timeout, on_line)
        except (OSError, paramiko.SSHException, EOFError) as exc:
            self.close()
            raise UnreachableHost(self.host, f"connection lost while running {argv[0]}: {in_words(exc)}") from exc
        seconds = time.monotonic() - started
        if timed_out:
            self._record(command, 124, seconds, True)
            return Result(mask(command), 124, out, err, seconds, True)
        self._record(command, exited, seconds, False)
        transport = self.connection.client.get_transport()
        if exited == -1 and not (transport and transport.is_active()):
            # No exit status and no connection: the host went away while the command ran.
            self.close()
            raise UnreachableHost(self.host, f"connection lost while running {argv[0]} (after {seconds:.0f}s); "
                                  "what it started on the host finishes or stops there under its lock")
        return Result(mask(command), exited, out, err, seconds)

    def put(self, local: Path, remote: str, progress: Callable[[int, int], None] | None = None) -> None:
        """Copy a file over SFTP to a temporary name, then rename it into place."""
        self._open()
        temporary = f"{remote}.partial"
        try:
            sftp = self.connection.sftp()
            sftp.put(str(local), temporary, callback=progress)
            sftp.posix_rename(temporary, remote)
        except (OSError, paramiko.SSHException, EOFError) as exc:
            self.close()
            raise UnreachableHost(self.host, f"copy of {local.name} to {remote} failed: {in_words(exc)}") from exc
        log.debug("%s: put %s -> %s", self.host, local, remote)

    def get(self, remote: str, local: Path) -> None:
        """Copy a file from the host over SFTP."""
        self._open()
        try:
            self.connection.sftp().get(remote, str(local))
        except (OSError, paramiko.SSHException, EOFError) as exc:
            self.close()
            raise UnreachableHost(self.host, f"copy of {remote} from the host failed: {in_words(exc)}") from exc

    def close(self) -> None:
        self.connection.close()


def _exec(transport: paramiko.Transport | None, command: str, stdin: str | None, timeout: float,
          on_line: Callable[[str], None] | None) -> tuple[int, str, str, bool]:
    """One command in one session of the open connection: stdin sent whole, stdout and stderr read
    as they come (stdout handed to on_line line by line), waiting on the channel, never spinning.
    Returns (exit status or -1 when none came, stdout, stderr, timed out)."""
    if transport is None or not transport.is_active():
        raise EOFError("the connection is closed")
    deadline = time.monotonic() + timeout
    channel = transport.open_session(timeout=min(timeout, 60))
    try:
        channel.exec_command(command)
        to_send = memoryview((stdin or "").encode())
        if not to_send:
            channel.shutdown_write()
        out, err = bytearray(), bytearray()
        pending = b""
        while True:
            if to_send and channel.send_ready():
                sent = channel.send(bytes(to_send[:65536]))
                to_send = to_send[sent:]
                if not to_send:
                    channel.shutdown_write()
            while channel.recv_ready():
                chunk = channel.recv(65536)
                out += chunk
                if on_line is not None:
                    *lines, pending = (pending + chunk).split(b"\n")
                    for line in lines:
                        on_line(line.decode(errors="replace"))
            while channel.recv_stderr_ready():
                err += channel.recv_stderr(65536)
            # sshd may send the exit status before the last output: only EOF ends the output.
            if (channel.eof_received or channel.closed) and not channel.recv_ready() \
                    and not channel.recv_stderr_ready():
                break
            if not transport.is_active():
                break
            left = deadline - time.monotonic()
            if left <= 0:
                return 124, out.decode(errors="replace"), err.decode(errors="replace"), True
            # The channel's descriptor wakes on data, EOF and close; the short cap catches an exit
            # status that comes alone, and stdin still to send.
            select.select([channel], [], [], min(left, 0.005 if to_send else 0.1))
        if on_line is not None and pending:
            on_line(pending.decode(errors="replace"))
        # The status follows EOF; a channel closed without one (a lost connection) says -1.
        channel.status_event.wait(max(0.0, min(deadline - time.monotonic(), 10)))
        exited = channel.exit_status if channel.exit_status_ready() else -1
        return exited, out.decode(errors="replace"), err.decode(errors="replace"), False
    finally:
        channel.close()


# ---------------------------------------------------------------------------------------------
# Local


class LocalRunner(_Counting):
    """This machine through Invoke's Context: the tool running on the node itself."""

    def __init__(self, host: Host, command_timeout: float = 600.0) -> None:
        self.host = host.name
        self.executions = 0
        self.command_timeout = command_timeout
        self.context = InvokeContext(InvokeConfig(lazy=True, overrides={"runners": {"local": _Local}}))

    def run(self, argv: Sequence[str], *, stdin: str | None = None, timeout: float | None = None,
            env: Mapping[str, str] | None = None, on_line: Callable[[str], None] | None = None) -> Result:
        command = command_line(argv, env)
        started = time.monotonic()
        in_stream: io.StringIO | bool = io.StringIO(stdin) if stdin is not None else False
        try:
            done = self.context.run(command, warn=True, in_stream=in_stream,
                                    timeout=timeout or self.command_timeout, **_streaming(on_line))
        except CommandTimedOut as exc:
            seconds = time.monotonic() - started
            self._record(command, 124, seconds, True)
            return Result(mask(command), 124, exc.result.stdout, exc.result.stderr, seconds, True)
        seconds = time.monotonic() - started
        assert done is not None  # warn=True always returns a Result
        self._record(command, done.exited, seconds, False)
        return Result(mask(command), done.exited, done.stdout, done.stderr, seconds)

    def put(self, local: Path, remote: str, progress: Callable[[int, int], None] | None = None) -> None:
        temporary = Path(f"{remote}.partial")
        shutil.copyfile(local, temporary)
        temporary.replace(remote)
        if progress:
            size = local.stat().st_size
            progress(size, size)

    def get(self, remote: str, local: Path) -> None:
        shutil.copyfile(remote, local)

    def close(self) -> None:
        return None


def free_port() -> int:
    """A TCP port free on this machine's loopback now (the OS picks it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def forwarded(runner: Runner, address: str, port: int) -> Iterator[tuple[str, int]]:
    """ADDRESS:PORT as the host sees it, reached from this machine while the block runs: over an SSH
    runner's connection (Fabric's forward_local, a loopback port here), directly for this machine."""
    if not isinstance(runner, SshRunner):
        yield address, port
        return
    runner._open()
    local = free_port()
    with ExitStack() as stack:
        try:
            stack.enter_context(runner.connection.forward_local(local, remote_port=port, remote_host=address))
        except (OSError, paramiko.SSHException) as exc:
            raise UnreachableHost(runner.host, f"cannot forward to {address}:{port} on the host: "
                                  f"{in_words(exc)}") from exc
        yield "127.0.0.1", local


class Pool:
    """One connection per host for a whole run: its facts, pushes and apply share one SSH login.
    Runners connect on first use; one that lost its connection connects again when used."""

    def __init__(self, ssh: SshSettings, *, accept_new_host_keys: bool = False) -> None:
        self.ssh = ssh
        self.accept_new_host_keys = accept_new_host_keys
        self._runners: dict[str, Runner] = {}
        self._lock = threading.Lock()

    def connect(self, host: Host) -> Runner:
        with self._lock:
            if host.name not in self._runners:
                self._runners[host.name] = connect(host, self.ssh, accept_new_host_keys=self.accept_new_host_keys)
            return self._runners[host.name]

    def close(self) -> None:
        with self._lock:
            runners, self._runners = list(self._runners.values()), {}
        for runner in runners:
            runner.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def connect(host: Host, ssh: SshSettings, *, accept_new_host_keys: bool = False) -> Runner:
    """The runner for a host: local for `connection: local`, SSH otherwise (connects on first use)."""
    if host.connection == "local":
        return LocalRunner(host, ssh.command_timeout)
    return SshRunner(host, ssh, accept_new_host_keys=accept_new_host_keys)
