"""doctor's links: an ok link carries its proof and, after it, each warning (a finding that does not break it)."""

from __future__ import annotations

from gpunode.diagnosis import Finding, Verdict
from gpunode.doctor import host_links
from gpunode.verify.checks import STEPS, StepResult, verdict


class OneHost:
    """What host_links reads of a Verification: no connection error, a verdict per step."""

    def __init__(self, results: dict[str, StepResult]) -> None:
        self.errors: dict = {}
        self.results = results

    def result(self, host: str, step: str) -> StepResult:
        return self.results.get(step) or StepResult(host, step, Verdict.NOT_CHECKED, "not read in this test")


def test_an_ok_link_shows_its_warnings_after_its_proof() -> None:
    proof = Finding("driver", Verdict.OK, "driver 550.54.15 OK", ["nvidia-smi: 4x NVIDIA A100-SXM4-40GB"], code="ok")
    warning = Finding("driver", Verdict.FINDING, "persistence mode is off on GPU(s) 1",
                      ["nvidia-smi persistence_mode: GPU 1 Disabled"], "systemctl enable --now nvidia-persistenced",
                      "persistence-mode-off", breaks=False)
    result = verdict("node01", "driver", [warning, proof])
    assert result.state is Verdict.OK
    link = host_links("node01", OneHost({"driver": result}))[STEPS.index("driver")]  # type: ignore[arg-type]
    assert (link.state, link.what) == (Verdict.OK, "driver 550.54.15 OK")
    assert link.evidence == ["nvidia-smi: 4x NVIDIA A100-SXM4-40GB",
                             "warning: persistence mode is off on GPU(s) 1 (nvidia-smi persistence_mode: GPU 1 "
                             "Disabled; fix: systemctl enable --now nvidia-persistenced)"]
