"""The verification engine: one host whose facts the diagnosis cannot judge fails that host alone, with where."""

from __future__ import annotations

import pytest

from gpunode.connection import Reply
from gpunode.verify import engine
from gpunode.verify.checks import ClusterView
from gpunode.verify.targets import Target


def test_a_diagnosis_that_breaks_on_one_host_fails_that_host_with_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    def judge(name: str, facts: dict, settings: object, cluster: ClusterView) -> dict:
        if name == "node01":
            return {}.get("x").split()  # the kind of surprise a removed package's version once caused
        return {"driver": "judged"}

    monkeypatch.setattr(engine, "judge", judge)
    verification = engine.Verification.__new__(engine.Verification)
    verification.targets = {name: Target(name, {}, []) for name in ("node01", "node02")}
    verification.facts, verification.cluster = {}, ClusterView()
    failed = verification._judge("node01", Reply(True, "", ""))
    assert isinstance(failed, engine.Finding) and failed.code == "judge-failed"
    assert failed.what == ("gpunode could not judge node01's facts: AttributeError: 'NoneType' object has no "
                           "attribute 'split'")
    assert any("test_verify_engine.py" in line for line in failed.evidence), failed.evidence
    assert "gpunode doctor --limit node01 --json" in failed.fix
    assert verification._judge("node02", Reply(True, "", "")) == {"driver": "judged"}


def test_the_pytest_plugin_takes_the_hosts_verify_already_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """`verify --junit-xml` reads the inventory once: the plugin takes the loaded hosts, handed in by pytest.main."""
    from types import SimpleNamespace

    from gpunode.verify import plugin

    targets = [Target("node01", {}, [])]

    def load_again(*args: object) -> list[Target]:
        raise AssertionError("the inventory was read a second time")

    class Recorded:
        def __init__(self, given: list[Target]) -> None:
            self.given = given

        def read_all(self) -> None:
            pass

    monkeypatch.setattr(plugin, "load_inventory", load_again)
    monkeypatch.setattr(plugin, "Verification", Recorded)
    options = {"gpunode_inventory": "inventories/prod.py", "gpunode_in_cluster": False}
    config = SimpleNamespace(getoption=lambda name, default=None: options.get(name, default), stash={},
                             pluginmanager=SimpleNamespace(get_plugins=lambda: [object(),
                                                                                plugin.PreloadedTargets(targets)]))
    plugin.pytest_sessionstart(SimpleNamespace(config=config))
    assert config.stash[plugin.VERIFICATION_KEY].given is targets
