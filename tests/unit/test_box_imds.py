"""The box's instance metadata (tests/box/imds.py) refuses what EC2 refuses: a token TTL outside 1 to
21600 s, a token past its TTL, a token used by another instance than the one it was issued to."""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterator

import pytest

from tests.box.imds import InstanceMetadata

INSTANCE = {"InstanceId": "i-0box", "PrivateIpAddress": "127.0.0.1", "MetadataOptions": {}}


@pytest.fixture
def imds() -> Iterator[InstanceMetadata]:
    metadata = InstanceMetadata(lambda address: INSTANCE, port=0, address="127.0.0.1")
    yield metadata
    metadata.stop()


def ask(
    imds: InstanceMetadata, method: str, path: str, headers: dict[str, str], source: str = "127.0.0.1"
) -> tuple[int, str]:
    connection = http.client.HTTPConnection(
        "127.0.0.1", imds.server.server_address[1], timeout=5, source_address=(source, 0)
    )
    connection.request(method, path, headers=headers)
    response = connection.getresponse()
    body = response.read().decode()
    connection.close()
    return response.status, body


def token(imds: InstanceMetadata, ttl: str, source: str = "127.0.0.1") -> tuple[int, str]:
    return ask(imds, "PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": ttl}, source)


def instance_id(imds: InstanceMetadata, value: str, source: str = "127.0.0.1") -> int:
    return ask(imds, "GET", "/latest/meta-data/instance-id", {"X-aws-ec2-metadata-token": value}, source)[0]


@pytest.mark.parametrize("ttl", ["0", "21601", "-5", "six", ""])
def test_a_ttl_outside_ec2s_range_is_refused(imds: InstanceMetadata, ttl: str) -> None:
    assert token(imds, ttl)[0] == 400


def test_a_token_expires_after_its_ttl(imds: InstanceMetadata) -> None:
    status, value = token(imds, "1")
    assert status == 200 and instance_id(imds, value) == 200
    time.sleep(1.1)
    assert instance_id(imds, value) == 401
    assert instance_id(imds, token(imds, "21600")[1]) == 200


def test_a_token_works_only_on_the_instance_it_was_issued_to(imds: InstanceMetadata) -> None:
    _, value = token(imds, "60", source="127.0.0.2")
    assert instance_id(imds, value, source="127.0.0.1") == 401
    assert instance_id(imds, value, source="127.0.0.2") == 200
