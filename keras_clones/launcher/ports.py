"""Free TCP ports on 127.0.0.1, for local clusters (`keras_clones.launch`,
`keras_clones.parameter_server.cluster`).

Standard library only, as the launcher.
"""

import socket


def free_ports(count):
    """`count` distinct free ports on 127.0.0.1."""
    # All sockets stay bound until every port is picked, so the ports are
    # distinct; another process could take one before its server binds it.
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
