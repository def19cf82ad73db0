"""Raw HTTP/1.1 on a socket, for the tests that play a hostile client:
bytes sent exactly as written (bad framing, trickles, partial requests),
responses read with the standard library's parser (http.client)."""

import http.client
import socket
import time


class _Reply(http.client.HTTPResponse):
    """A response read from the connection's one buffered file, which stays
    open for the next response."""

    def _close_conn(self):
        self.fp = None


class Connection:
    """One TCP connection to 127.0.0.1:`port`."""

    def __init__(self, port, timeout=10):
        self.sock = socket.create_connection(("127.0.0.1", port),
                                             timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.file = self.sock.makefile("rb")

    def send(self, data):
        self.sock.sendall(data)

    def trickle(self, data, every):
        """Sends `data` one byte at a time, `every` seconds apart; stops
        quietly when the server has closed the connection (returns how many
        bytes went out)."""
        for i, byte in enumerate(data):
            try:
                self.sock.sendall(bytes([byte]))
            except OSError:
                return i
            time.sleep(every)
        return len(data)

    def response(self):
        """The next response: (status, headers dict with lower-case names,
        body); None when the server closed or sent nothing in time."""
        reply = _Reply(self.sock)
        reply.fp = self.file
        try:
            reply.begin()
        except (http.client.HTTPException, OSError):
            return None
        body = reply.read()
        return (reply.status, {k.lower(): v for k, v in reply.getheaders()},
                body)

    def closed_by_server(self, within=5):
        """Whether the server closes the connection within `within` seconds
        (what it still sends is read and dropped)."""
        self.sock.settimeout(within)
        deadline = time.monotonic() + within
        try:
            while time.monotonic() < deadline:
                if not self.sock.recv(65536):
                    return True
        except ConnectionResetError:
            return True
        except OSError:
            return False
        return False

    def close(self):
        try:
            self.file.close()
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def request(method, path, body=b"", headers=(), host=True):
    """The bytes of a request with `headers` (pairs) and `body`; a
    Content-Length is added unless a header names one or a
    Transfer-Encoding."""
    lines = [f"{method} {path} HTTP/1.1"]
    if host:
        lines.append("Host: normd")
    names = {name.lower() for name, _ in headers}
    lines += [f"{name}: {value}" for name, value in headers]
    if "content-length" not in names and "transfer-encoding" not in names:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body
