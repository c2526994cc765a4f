"""A relay server's life on a real host is its controller's SSH session: the connection that started
it closed, it stops serving (host/relay.py watch_controller), whatever its peers said."""
from __future__ import annotations

import time

import pytest

from provision import inventory, relay, remote
from tests.lab.conftest import on_host

pytestmark = pytest.mark.lab

PROBE = ("import socket, sys\ns = socket.socket()\ns.settimeout(2)\n"
         "print(s.connect_ex((sys.argv[1], int(sys.argv[2]))))\n")


def test_a_relay_server_stops_once_the_controllers_connection_is_gone(lab_inventory: inventory.Inventory) -> None:
    host = lab_inventory.host("cpu-1")
    runner = remote.SshRunner(host, lab_inventory.ssh)
    # A peer that never says done: only the session's end can stop it before its 600 s idle.
    server = relay.Server(runner, host.address, "/nonexistent/final", "/nonexistent/partial", ".part",
                          {"model.safetensors": 10}, peers=1)
    port = int(server.start().rsplit(":", 1)[1].split("/", 1)[0])

    def listens() -> bool:
        return on_host(lab_inventory, "cpu-1", ["python3", "-c", PROBE, host.address, str(port)]).strip() == "0"

    assert listens()
    runner.close()  # the controller's connection gone (the tool exited, or was killed)
    deadline = time.monotonic() + 10
    while listens():
        assert time.monotonic() < deadline, f"cpu-1 still serves on port {port} 10 s after the controller left"
        time.sleep(0.5)
    server.thread.join(10)
