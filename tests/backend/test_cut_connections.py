"""Cutting a process group's connections (nbdist.backend.procgroup.shutdown_connections) acts only on the sockets it
found: a descriptor closed and reused meanwhile, for a file or a socket of another kind, is left alone. Real
sockets on loopback."""

from __future__ import annotations

import os
import socket

from nbdist.backend.procgroup import _shutdown, tcp_connections


def test_a_descriptor_reused_for_a_unix_socket_between_the_look_and_the_cut_is_left_alone():
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    served, _ = listener.accept()
    try:
        fd = client.fileno()
        local, remote = tcp_connections()[fd]  # what the cut found
        assert _shutdown(fd, local, remote, socket.SHUT_RD) == 1  # the connection it found: cut
        one, other = socket.socketpair()  # unnamed Unix sockets, as a kernel's ipc channels and pipes have
        os.dup2(one.fileno(), fd)  # the descriptor now names one of them
        try:
            assert _shutdown(fd, local, remote, socket.SHUT_WR) == 0
        finally:
            one.close()
            other.close()
        with open(os.devnull) as f:
            os.dup2(f.fileno(), fd)  # and a file
            assert _shutdown(fd, local, remote, socket.SHUT_WR) == 0
    finally:
        for s in (client, served, listener):
            s.close()
