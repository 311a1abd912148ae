"""The Kubernetes gateway of a canary release, run by the real HAProxy: the configuration infra/k8s renders
for a release at a 50 % share, its model servers' DNS slots pointed at two local servers (the stable one
answering 200, the canary 500), read back through its Prometheus exporter (what a gateway pod exposes on
its metrics port) and through its runtime API (`show stat`, what the Slurm platform's gateway program
reads). Both readings must give the same figures, and those must be the requests the client saw.

Needs /usr/sbin/haproxy (scripts/setup-host.sh installs Debian's package); skips saying so without it."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from infra.k8s.serving import CANARY_BACKEND, GATEWAY_BACKEND, serving_objects
from infra.k8s.serving_versions import ServedVersion, ServingRelease
from infra.platform.resolve import load_platform
from infra.serving.metrics_text import exporter_figures
from infra.spec.load import stack_file
from tests.conftest import fsx_facts, load_script
from tests.roles.test_gateway_reload import HAPROXY, ModelServer, free_port, listening, wait_for

FILES = Path(__file__).resolve().parents[2] / "roles" / "inference_gateway" / "files"
REQUESTS = 200

pytestmark = pytest.mark.skipif(
    HAPROXY is None, reason="no haproxy binary: scripts/setup-host.sh installs Debian's package"
)


class FailingServer(ModelServer):
    """The canary: /health 200 (its checks pass, so it stays up), 500 on any other path."""

    def __init__(self, address: str, port: int) -> None:
        super().__init__(address, port, delay_s=0)
        handler = self.server.RequestHandlerClass
        answer_ok = handler.do_GET  # type: ignore[attr-defined]

        def do_get(request: object) -> None:
            if request.path == "/health":  # type: ignore[attr-defined]
                answer_ok(request)
                return
            request.send_response(500)  # type: ignore[attr-defined]
            request.send_header("Content-Length", "0")  # type: ignore[attr-defined]
            request.end_headers()  # type: ignore[attr-defined]

        handler.do_GET = do_get  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def gateway_program() -> Iterator[ModuleType]:
    sys.path.insert(0, str(FILES))  # it imports the runtime API client of gpuplat_gateway_targets.py
    try:
        yield load_script(FILES / "gpuplat_gateway_canary.py")
    finally:
        sys.path.remove(str(FILES))


def release_config(directory: Path, stable_port: int, canary_port: int, port: int, metrics: int) -> str:
    platform = load_platform(stack_file("aws-k8s"))
    release = ServingRelease(
        ServedVersion("embedder@1", "/m/1"), canary=ServedVersion("embedder@2", "/m/2"), canary_percent=50
    )
    [config] = [
        o["data"]["haproxy.cfg"]
        for o in serving_objects(platform, fsx_facts(), release)
        if o["kind"] == "ConfigMap"
    ]
    # This host's own: no privilege drop, the test holds the process, its own socket and ports.
    config = re.sub(r"^\s+(user|group) haproxy\n|^\s+daemon\n", "", config, flags=re.MULTILINE)
    config = re.sub(r"stats socket \S+", f"stats socket {directory / 'admin.sock'}", config)
    config = config.replace(":8080\n", f":{port}\n").replace(":8404\n", f":{metrics}\n")
    # Each version's DNS slots (the cluster's headless Services) as one local server.
    slots = re.findall(r"^\s+server-template .*$", config, re.MULTILINE)
    assert len(slots) == 2, slots
    config = config.replace(slots[0], f"    server stable-1 127.0.0.1:{stable_port} check")
    return config.replace(slots[1], f"    server canary-1 127.0.0.1:{canary_port} check")


def test_the_exporter_and_show_stat_agree_with_what_the_client_saw(
    tmp_path: Path, gateway_program: ModuleType
) -> None:
    stable_port, canary_port, port, metrics = (free_port() for _ in range(4))
    stable, canary = ModelServer("127.0.0.1", stable_port, delay_s=0), FailingServer("127.0.0.1", canary_port)
    (tmp_path / "haproxy.cfg").write_text(release_config(tmp_path, stable_port, canary_port, port, metrics))
    haproxy = subprocess.Popen(
        [str(HAPROXY), "-db", "-f", str(tmp_path / "haproxy.cfg")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: listening(port) and listening(metrics), "HAProxy listening")
        seen: Counter[int] = Counter()
        for _ in range(REQUESTS):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/embeddings", timeout=5) as reply:
                    seen[reply.status] += 1
            except urllib.error.HTTPError as error:
                seen[error.code] += 1
        assert set(seen) <= {200, 500} and sum(seen.values()) == REQUESTS, seen
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as reply:
            exported = exporter_figures(reply.read().decode(), (GATEWAY_BACKEND, CANARY_BACKEND), 50)
        api = gateway_program.RuntimeApi(str(tmp_path / "admin.sock"))
        shown = gateway_program.backend_figures(api)
    finally:
        haproxy.terminate()
        haproxy.wait(timeout=10)
        stable.stop()
        canary.stop()
    assert exported.requests == {GATEWAY_BACKEND: seen[200], CANARY_BACKEND: seen[500]}
    assert exported.errors == {GATEWAY_BACKEND: 0, CANARY_BACKEND: seen[500]}
    assert exported.servers_up == {GATEWAY_BACKEND: 1, CANARY_BACKEND: 1}
    for backend in (GATEWAY_BACKEND, CANARY_BACKEND):
        assert shown[backend]["requests"] == exported.requests[backend]
        assert shown[backend]["errors"] == exported.errors[backend]
        assert shown[backend]["servers_up"] == exported.servers_up[backend]
    # A 50 % draw over 200 requests: both versions took some (a binomial tail of 2 x 0.5^200 otherwise).
    assert seen[200] and seen[500]
