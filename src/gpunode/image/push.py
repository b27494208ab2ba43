"""Pushing the device plugin's image to a registry, and resolving a tag there to a digest, through skopeo.

skopeo (the containers project's tool, packaged by Debian, Ubuntu, Fedora and RHEL) copies an OCI archive to a
registry without a container engine or a daemon, honours the registry trust a node admin already set up
(``/etc/containers/certs.d/HOST:PORT/``, or a certificate folder given here) and the credentials of ``docker
login``/``skopeo login``. ``--preserve-digests`` keeps the image's bytes as built, so the digest the registry
serves is the archive's own: a DaemonSet pinned to it runs exactly what was built.

Credentials given here travel in a private auth file for the one skopeo call, never on its command line.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gpunode.errors import GpunodeError

TOOL = "skopeo"
TIMEOUT = 600.0
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
INSTALL_FIX = "install skopeo (apt-get install skopeo / dnf install skopeo) on the machine that pushes"


@dataclass(frozen=True)
class Registry:
    """How to reach a registry: a folder with its CA (``ca.crt``; None: the system's trust) and credentials
    (None: those of ``docker login`` / ``skopeo login``)."""

    cert_dir: Path | None = None
    username: str | None = None
    password: str | None = None


def split_reference(reference: str) -> tuple[str, str]:
    """``(registry host[:port], rest)`` of an image reference; refuses one without a registry host."""
    host, slash, rest = reference.partition("/")
    if not slash or not rest or not ("." in host or ":" in host or host == "localhost"):
        raise GpunodeError(f"image reference {reference!r} names no registry",
                           "write REGISTRY[:PORT]/REPOSITORY[:TAG], e.g. registry.example:5000/gpu/device-plugin:0.1.0")
    if not re.fullmatch(r"[a-z0-9]+(?:[._/-][a-z0-9]+)*(?::[\w][\w.-]{0,127}|@sha256:[0-9a-f]{64})?", rest):
        raise GpunodeError(f"image reference {reference!r}: {rest!r} is not a repository with an optional tag",
                           "a repository is lower-case letters, digits and . _ - / ; a tag follows ':'")
    return host, rest


def auth_file(folder: Path, host: str, registry: Registry) -> Path | None:
    """A docker-style auth file with ``registry``'s credentials for ``host`` (mode 0600), or None without any."""
    if registry.username is None:
        return None
    token = base64.b64encode(f"{registry.username}:{registry.password or ''}".encode()).decode()
    path = folder / "auth.json"
    path.touch(mode=0o600)
    path.write_text(json.dumps({"auths": {host: {"auth": token}}}))
    return path


def _skopeo(args: list[str], what: str) -> str:
    if shutil.which(TOOL) is None:
        raise GpunodeError(f"{what} needs skopeo, which is not on PATH", INSTALL_FIX)
    try:
        result = subprocess.run([TOOL, *args], capture_output=True, text=True, timeout=TIMEOUT, check=False)
    except subprocess.TimeoutExpired as error:
        raise GpunodeError(f"{what}: skopeo did not finish in {TIMEOUT:.0f} s",
                           "check that the registry answers (curl https://HOST/v2/)") from error
    if result.returncode != 0:
        said = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else f"exit {result.returncode}"
        raise GpunodeError(f"{what} failed: {said}", registry_fix(said))
    return result.stdout


# what a registry's refusal is, from the words of skopeo, containerd and docker (they say the same): first match
REFUSALS = (
    ("credentials", ("401 unauthorized", "unauthorized", "authentication required", "no basic auth credentials",
                     "403 forbidden", "pull access denied", "requested access to the resource is denied")),
    ("missing", ("manifest unknown", "not found")),
    ("trust", ("x509", "certificate")),
    ("tls", ("server gave http response to https client", "400 bad request")),
    ("reach", ("no such host", "connection refused", "timeout", "dial tcp", "network is unreachable")),
)


def refusal(said: str) -> str | None:
    """The cause a registry's refusal names (a key of REFUSALS), or None when its words name none."""
    lowered = said.lower()
    return next((cause for cause, words in REFUSALS if any(word in lowered for word in words)), None)


def registry_fix(said: str) -> str:
    """What to do about a registry's refusal to this machine (skopeo's words)."""
    return {
        "credentials": "the registry refused the credentials: check the user name and password (--username and "
                       "GPUNODE_REGISTRY_PASSWORD, or 'skopeo login HOST')",
        "missing": "the registry has no such tag or repository: push the image first (gpunode image push), or fix "
                   "the name",
        "trust": "the registry's certificate is not trusted here: pass --cert-dir with its CA as ca.crt, or put the "
                 "CA in /etc/containers/certs.d/HOST:PORT/ca.crt",
        "tls": "this machine and the registry disagree about TLS (plain HTTP to a TLS port, or the other way round): "
               "check the host and port",
        "reach": "the registry does not answer at that address: check the host and port",
    }.get(refusal(said) or "", "read skopeo's words above; 'skopeo inspect docker://REFERENCE' shows what the "
                               "registry answers")


def _transport_args(prefix: str, folder: Path, host: str, registry: Registry) -> list[str]:
    args = []
    if registry.cert_dir is not None:
        if not (registry.cert_dir / "ca.crt").is_file() and not any(registry.cert_dir.glob("*.crt")):
            raise GpunodeError(f"{registry.cert_dir} holds no certificate (*.crt)",
                               "put the registry's CA certificate there as ca.crt")
        args += [f"--{prefix}cert-dir", str(registry.cert_dir)]
    credentials = auth_file(folder, host, registry)
    if credentials is not None:
        args += [f"--{prefix}authfile", str(credentials)]
    return args


def push(archive: Path, reference: str, registry: Registry) -> str:
    """Copy the OCI archive to ``reference`` (REGISTRY/REPOSITORY:TAG), bytes unchanged; return its digest."""
    host, _ = split_reference(reference)
    if "@" in reference:
        raise GpunodeError(f"cannot push to {reference}: a digest names what is there already", "push to a tag")
    if not archive.is_file():
        raise GpunodeError(f"no image archive at {archive}", "build it first (gpunode image build)")
    with tempfile.TemporaryDirectory(prefix="gpunode-push-") as work:
        digest_file = Path(work) / "digest"
        _skopeo(["copy", "--quiet", "--preserve-digests", *_transport_args("dest-", Path(work), host, registry),
                 "--digestfile", str(digest_file), f"oci-archive:{archive}", f"docker://{reference}"],
                f"pushing {archive} to {reference}")
        digest = digest_file.read_text().strip() if digest_file.is_file() else ""
    if not DIGEST.fullmatch(digest):
        raise GpunodeError(f"skopeo pushed {reference} but wrote no digest ({digest!r})",
                           f"skopeo inspect docker://{reference} shows it")
    return digest


def resolve(reference: str, registry: Registry) -> str:
    """The digest ``reference`` has in its registry now (``sha256:...``)."""
    host, _ = split_reference(reference)
    with tempfile.TemporaryDirectory(prefix="gpunode-inspect-") as work:
        out = _skopeo(["inspect", "--format", "{{.Digest}}", *_transport_args("", Path(work), host, registry),
                       f"docker://{reference}"], f"reading {reference} from its registry").strip()
    if not DIGEST.fullmatch(out):
        raise GpunodeError(f"the registry's answer for {reference} holds no digest ({out[:80]!r})",
                           f"skopeo inspect docker://{reference} shows what it answers")
    return out


def pinned(reference: str, digest: str) -> str:
    """``REGISTRY/REPOSITORY@DIGEST`` for a reference by tag (the tag is dropped: the digest alone decides)."""
    name = reference.split("@", 1)[0]
    last = name.rsplit("/", 1)
    if ":" in last[-1]:
        name = name[: name.rfind(":")]
    return f"{name}@{digest}"


def pin(image: str, registry: Registry) -> tuple[str, str]:
    """``image`` pinned to the digest its tag has in its registry now, and a line saying what was done.

    A reference with a digest stays as it is; one that cannot be resolved here (no registry host, no skopeo, the
    registry refusing) stays as given, and the line says why: the nodes then pull the tag.
    """
    if "@sha256:" in image:
        return image, f"{image} is pinned by digest already"
    try:
        split_reference(image)
        digest = resolve(image, registry)
    except GpunodeError as error:
        return image, f"{image} not pinned to a digest: {error.problem}"
    return pinned(image, digest), f"{image} pinned to its digest in the registry: {digest}"
