"""Choosing ports (p2p/net/ports.py): pairs of adjacent free ports, clear of pairs given out."""

import p2p.net.ports as ports_module
from p2p.net.ports import free_ports


class ScriptedSocket:
    """A socket whose bind to port 0 gets the next port of a script, as the OS's ephemeral range
    would: what the OS may hand out again is a port given to a node that has not bound it yet."""

    script: list[int] = []

    def __init__(self, *args):
        self.port = None

    def bind(self, address):
        self.port = address[1] or ScriptedSocket.script.pop(0)

    def getsockname(self):
        return ("127.0.0.1", self.port)

    def close(self):
        pass


def test_free_ports_never_returns_a_pair_overlapping_one_given_out(monkeypatch):
    # Seen in CI: a joiner whose chosen port was taken got another, the OS handed out the
    # bootstrap peer's port (its process still importing), and the bootstrap peer exited
    # "address in use". 5000 (its pair) and 4999 / 5001 (overlapping pairs) are refused.
    monkeypatch.setattr(ports_module.socket, "socket", ScriptedSocket)
    ScriptedSocket.script = [5000, 4999, 5001, 6000]
    assert free_ports(1, avoid=[5000]) == [6000]
    ScriptedSocket.script = [5000, 4999, 5001, 6000]
    assert free_ports(1) == [5000]  # without it the first pair the OS offers
    # and the pairs of one call stay apart from each other, as before
    ScriptedSocket.script = [7000, 7001, 6999, 7002]
    assert free_ports(2) == [7000, 7002]
