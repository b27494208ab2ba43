"""Facts of the toolkit repository step: the packaging family, then apt's or dnf's view of NVIDIA's repository.

apt (Debian, Ubuntu): the keyring, the list line, stale NVIDIA lists. dnf (RHEL
family): the ``.repo`` file, the key file it names and the keys rpm trusts,
stale NVIDIA ``.repo`` files. Both are read everywhere (a few file tests); the
family from ``/etc/os-release`` says which one counts.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from gpunode.facts import os_release
from gpunode.facts.sections import section, split_sections
from gpunode.settings import KEYRING_PATH, LIST_PATH, REPO_FILE_PATH, RPM_KEY_PATH

STALE_MARKERS = ("nvidia-docker", "libnvidia-container", "nvidia-container-runtime", "nvidia-container-toolkit")


def _fingerprints(path: str) -> str:
    return f"[ -f {path} ] && gpg --show-keys --with-colons {path} 2>/dev/null | awk -F: '$1==\"fpr\"{{print $10}}'"


class ToolkitRepoState(FactBase):
    """The NVIDIA Container Toolkit repository as configured on the node, for apt and for dnf.

    .. code:: python

        {
            "family": "deb",                         # "rpm", or None when /etc/os-release names neither
            "os_release": "ID=debian",               # what the family was read from
            "keyring_fingerprints": ["C95B321B61E88C1809C4F759DDCAE044F796ECB0"],  # [] when absent/unreadable
            "list": ["deb [signed-by=...] https://... /"],                          # None when absent
            "stale_lists": ["/etc/apt/sources.list.d/nvidia-docker.list"],
            "repo_file": ["[nvidia-container-toolkit]", ...],  # dnf's .repo file; None when absent
            "rpm_key_fingerprints": [...],           # of the key file the .repo names
            "rpm_trusted_keys": ["f796ecb0"],        # rpm -q gpg-pubkey: the keys rpm verifies packages with
            "stale_repos": ["/etc/yum.repos.d/nvidia-docker.repo"],
        }
    """

    def command(self, keyring: str = KEYRING_PATH, list_path: str = LIST_PATH) -> str:
        markers = "|".join(STALE_MARKERS)
        return "; ".join([
            section("os_release"), os_release.READ_COMMAND,
            section("keyring"), _fingerprints(keyring),
            section("list"),
            f"[ -f {list_path} ] && cat {list_path} && echo '##gpunode:present'",
            section("stale"),
            f"for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do"
            f" [ -f \"$f\" ] && [ \"$f\" != {list_path} ] && grep -qE '{markers}' \"$f\" && echo \"$f\"; done",
            section("repo_file"),
            f"[ -f {REPO_FILE_PATH} ] && cat {REPO_FILE_PATH} && echo '##gpunode:repo_present'",
            section("rpm_key"), _fingerprints(RPM_KEY_PATH),
            section("rpm_trusted"),
            "command -v rpm >/dev/null 2>&1 && [ -d /etc/yum.repos.d ] && rpm -q gpg-pubkey --qf '%{VERSION}\\n'"
            " 2>/dev/null | grep -v 'not installed'",
            section("stale_repos"),
            f"for f in /etc/yum.repos.d/*.repo; do"
            f" [ -f \"$f\" ] && [ \"$f\" != {REPO_FILE_PATH} ] && grep -qE '{markers}' \"$f\" && echo \"$f\"; done",
            "true",
        ])

    def process(self, output: list[str]) -> dict:
        parts = split_sections(output)
        family, read = os_release.package_family(parts.get("os_release", []))
        return {
            "family": family,
            "os_release": read,
            "keyring_fingerprints": [line.strip() for line in parts.get("keyring", []) if line.strip()],
            "list": parts.get("list") if "present" in parts else None,
            "stale_lists": parts.get("stale", []),
            "repo_file": parts.get("repo_file") if "repo_present" in parts else None,
            "rpm_key_fingerprints": [line.strip() for line in parts.get("rpm_key", []) if line.strip()],
            "rpm_trusted_keys": [line.strip().lower() for line in parts.get("rpm_trusted", []) if line.strip()],
            "stale_repos": parts.get("stale_repos", []),
        }
