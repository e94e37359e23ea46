"""Where each served node's metrics endpoint listens (``--metrics-address``: one HOST:PORT, or one
per node), and the one accepting thread that serves a thousand simulated nodes' endpoints."""

from __future__ import annotations

import threading
import urllib.request

import pytest

from fleetops.agent import metrics
from fleetops.agent.serve import endpoints, exposition


def test_one_address_gives_each_node_the_next_port_and_a_list_one_address_per_node() -> None:
    parse = exposition.parse_address
    assert endpoints.parse("127.0.0.1:9401", 3, parse) == [("127.0.0.1", 9401), ("127.0.0.1", 9402),
                                                          ("127.0.0.1", 9403)]
    assert endpoints.parse("127.0.0.1:0", 2, parse) == [("127.0.0.1", 0), ("127.0.0.1", 0)]
    assert endpoints.parse("127.0.10.1:9401,127.0.10.2:9401", 2, parse) == [("127.0.10.1", 9401),
                                                                         ("127.0.10.2", 9401)]


@pytest.mark.parametrize(("text", "count", "says"), [
    ("127.0.10.1:9401,127.0.10.2:9401", 3, "2 addresses for 3 served nodes"),
    ("127.0.10.1:9401,,127.0.10.2:9401", 3, "empty entry"),
    ("127.0.0.1:65535", 2, "past port 65535"),
    ("127.0.10.1:9401,127.0.10.2:http", 2, "expected HOST:PORT"),
])
def test_a_list_that_does_not_name_one_endpoint_per_node_is_refused(text: str, count: int, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        endpoints.parse(text, count, exposition.parse_address)


def _get(address: tuple[str, int]) -> str:
    with urllib.request.urlopen(f"http://{address[0]}:{address[1]}/metrics", timeout=10) as answer:
        return str(answer.read().decode())


def test_many_endpoints_on_their_own_addresses_share_one_accepting_thread() -> None:
    before = {t.name for t in threading.enumerate()}
    servers = [metrics.MetricsServer((f"127.0.0.{i + 1}", 0), lambda i=i: f"page_of_node {i}\n") for i in range(5)]
    served = endpoints.serve_all(servers, poll_s=0.2)
    try:
        new = [t.name for t in threading.enumerate() if t.name not in before]
        assert new.count("fleetops-metrics-accept") == 1 and "fleetops-metrics" not in new
        for i, endpoint in enumerate(served):
            host, port = endpoint.server_address[:2]
            assert host == f"127.0.0.{i + 1}" and port > 0
            assert _get((host, port)) == f"page_of_node {i}\n"
        served[0].shutdown()  # one endpoint stops; the others go on
        assert _get(served[1].server_address) == "page_of_node 1\n"
    finally:
        for endpoint in served:
            endpoint.shutdown()
            endpoint.server_close()
    acceptor = served[0].acceptor
    acceptor.thread.join(timeout=5)
    assert not acceptor.thread.is_alive()  # nothing left to accept for: the thread ends


class _Service:
    def __init__(self) -> None:
        self.doc = None

    def state(self) -> tuple[int, None]:
        return 0, None


def test_exposition_serves_each_service_at_its_listed_address() -> None:
    services = [_Service(), _Service()]
    servers = exposition.serve("127.0.0.3:0,127.0.0.4:0", services)
    try:
        assert [s.server_address[0] for s in servers] == ["127.0.0.3", "127.0.0.4"]
        for s in servers:
            assert _get(s.server_address) == "# no snapshot yet\n"
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()
