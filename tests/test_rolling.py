"""Data-driven: rolling batches of gpunode deploy, and the driver version a node's labels say."""

from __future__ import annotations

import pytest

from gpunode.cluster.labels import driver_version_of
from gpunode.deploy import rolling_batches
from gpunode.errors import GpunodeError
from gpunode.host_settings import HostSettings

HOSTS = ["node01", "node02", "node03"]


@pytest.mark.parametrize(("data", "batches"), [
    ({}, [HOSTS]),
    ({"max_unavailable": 0}, [HOSTS]),
    ({"max_unavailable": 1}, [["node01"], ["node02"], ["node03"]]),
    ({"max_unavailable": "2"}, [["node01", "node02"], ["node03"]]),
    ({"max_unavailable": 5}, [HOSTS]),
])
def test_rolling_batches(data: dict, batches: list[list[str]]) -> None:
    assert rolling_batches(HOSTS, HostSettings.from_data(data).max_unavailable) == batches


@pytest.mark.parametrize(("value", "message"), [
    ("some", "max_unavailable = 'some' is not accepted: expected a whole number"),
    (-1, "max_unavailable = -1 is not accepted: expected at least 0"),
])
def test_bad_max_unavailable_is_named(value: object, message: str) -> None:
    with pytest.raises(GpunodeError, match=message):
        HostSettings.from_data({"max_unavailable": value})


@pytest.mark.parametrize(("labels", "version"), [
    ({"nvidia.com/cuda.driver.major": "550", "nvidia.com/cuda.driver.minor": "54",
      "nvidia.com/cuda.driver.rev": "15"}, "550.54.15"),
    ({"nvidia.com/cuda.driver.major": "560", "nvidia.com/cuda.driver.minor": "35",
      "nvidia.com/cuda.driver.rev": ""}, "560.35"),
    ({"accelerator": "nvidia-a100"}, None),
])
def test_driver_version_from_labels(labels: dict, version: str | None) -> None:
    assert driver_version_of(labels) == version
