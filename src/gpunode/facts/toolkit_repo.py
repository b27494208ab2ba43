"""Facts of the toolkit repository step: the keyring, the apt list line, stale NVIDIA lists."""

from __future__ import annotations

from pyinfra.api import FactBase

from gpunode.facts.sections import section, split_sections
from gpunode.settings import KEYRING_PATH, LIST_PATH

STALE_MARKERS = ("nvidia-docker", "libnvidia-container", "nvidia-container-runtime", "nvidia-container-toolkit")


class ToolkitRepoState(FactBase):
    """The NVIDIA Container Toolkit apt source as configured on the node.

    .. code:: python

        {
            "keyring_fingerprints": ["C95B321B61E88C1809C4F759DDCAE044F796ECB0"],  # [] when absent/unreadable
            "list": ["deb [signed-by=...] https://... /"],                          # None when absent
            "stale_lists": ["/etc/apt/sources.list.d/nvidia-docker.list"],
        }
    """

    def command(self, keyring: str = KEYRING_PATH, list_path: str = LIST_PATH) -> str:
        markers = "|".join(STALE_MARKERS)
        return "; ".join([
            section("keyring"),
            f"[ -f {keyring} ] && gpg --show-keys --with-colons {keyring} 2>/dev/null"
            " | awk -F: '$1==\"fpr\"{print $10}'",
            section("list"),
            f"[ -f {list_path} ] && cat {list_path} && echo '##gpunode:present'",
            section("stale"),
            f"for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do"
            f" [ -f \"$f\" ] && [ \"$f\" != {list_path} ] && grep -qE '{markers}' \"$f\" && echo \"$f\"; done",
            "true",
        ])

    def process(self, output: list[str]) -> dict:
        parts = split_sections(output)
        return {
            "keyring_fingerprints": [line.strip() for line in parts.get("keyring", []) if line.strip()],
            "list": parts.get("list") if "present" in parts else None,
            "stale_lists": parts.get("stale", []),
        }
