"""Garbage from a host never escapes a fact parser or a diagnosis as anything but gpunode's own error.

Hypothesis writes outputs the way a broken or unusual host might: the facts' own section markers in any
order, exit-code lines, CSV-like and base64-like lines, binary junk. Each fact of every step parses them
and its diagnosis judges the result; either may say the host is broken (a finding, or a GpunodeError),
neither may raise anything else (which would fail every host of a run, or print a traceback).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpunode.errors import GpunodeError
from gpunode.facts.node import FACTS
from gpunode.facts.sections import MARK
from gpunode.settings import NodeSettings
from gpunode.verify.checks import DIAGNOSES

FACTS_DIR = Path(__file__).resolve().parents[1] / "src" / "gpunode" / "facts"
SECTIONS = sorted(set(re.findall(r'section\("([a-z_]+)"\)', "".join(p.read_text() for p in FACTS_DIR.glob("*.py")))))
LINE = st.one_of(
    st.sampled_from([f"{MARK}{name}" for name in SECTIONS]),
    st.sampled_from(["rc=0", "rc=1", "rc=x", "rc=", "present", "ok", "active", "containerd", "docker",
                     "version = 2", "[plugins", "{", "0, NVIDIA A100, GPU-1, 40960, 550.54.15, 00000000:07:00.0, "
                     "8.0, Disabled", "a, b, c, d, e, f, g, h", "1, x, y, z, w, v, u"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60),
    st.from_regex(r"[0-9a-zA-Z ,.:=/+\-\[\]]{0,60}", fullmatch=True),
    # CSV rows of the width nvidia-smi's query prints, with numbers where numbers belong or not
    st.lists(st.one_of(st.from_regex(r"[0-9]{1,3}", fullmatch=True), st.sampled_from(["x", "[N/A]", "", "-1"])),
             min_size=6, max_size=9).map(", ".join),
    st.tuples(st.from_regex(r"[a-z0-9./_-]{1,20}", fullmatch=True), st.text(max_size=20)).map(" ".join),
)


def output(step: str) -> st.SearchStrategy[list[str]]:
    """Outputs for ``step``'s fact: anything at all, or its own sections (each maybe closed by an rc line)."""
    own = re.findall(re.escape(MARK) + r"([a-z_]+)", FACTS[step]().command()) or SECTIONS
    section = st.tuples(st.sampled_from(own), st.lists(LINE, max_size=6),
                        st.sampled_from(["", "rc=0", "rc=0", "rc=1", "rc=x"]))
    return st.one_of(
        st.lists(LINE, max_size=25),
        st.lists(section, max_size=10).map(lambda parts: [line for name, body, rc in parts
                                                          for line in [f"{MARK}{name}", *body, *([rc] if rc else [])]]),
    )


@pytest.mark.parametrize("step", sorted(FACTS))
@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_any_output_parses_or_fails_with_gpunodes_own_error(step: str, data: st.DataObject) -> None:
    lines = data.draw(output(step), label="output")
    try:
        facts = FACTS[step]().process(lines)
        if step in DIAGNOSES:
            DIAGNOSES[step](facts, NodeSettings())
    except GpunodeError:
        pass
