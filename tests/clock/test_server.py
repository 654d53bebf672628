"""Rank 0's clock service serves every connection from one thread (issue 26: a thread per
connection cost rank 0 ~25-50 us of CPU a ping at 127 host leaders, and 511 leaders' warm-ups
starved its handshakes): many clients connect and ping at once, each is answered, no thread is
started per connection, and closed ones are forgotten."""

from __future__ import annotations

import threading
import time

from tf_otel.clock.transport import TcpClient, TcpServer

CLIENTS = 150


def test_many_clients_at_once_are_served_from_one_thread() -> None:
    server = TcpServer("127.0.0.1", 0)
    server.start()
    threads_before = threading.active_count()
    clients = [TcpClient("127.0.0.1", server.port, rank=r) for r in range(1, CLIENTS + 1)]
    answered = []

    def round_of(client: TcpClient) -> None:
        client.connect(10.0)
        answered.append(len(client.exchange(8, 10.0)))

    try:
        workers = [threading.Thread(target=round_of, args=(c,)) for c in clients]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(30.0)
        assert answered == [8] * CLIENTS
        assert server.connections == CLIENTS
        # the clients' own threads are gone: the server added none for its connections
        assert threading.active_count() <= threads_before
        assert server.bytes_in == CLIENTS * 8 * 16
    finally:
        for client in clients:
            client.close()
    deadline = time.monotonic() + 5.0
    while server.connections and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.connections == 0  # closed connections are not kept
    server.close()
