"""The plugin image in a registry of the user's: references, skopeo's call, the pull Secret and its RBAC rule."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpunode.cluster import rbac
from gpunode.cluster.manifests import PULL_SECRET, ManifestSettings, documents, render
from gpunode.errors import GpunodeError
from gpunode.image.push import Registry, pin, pinned, push, split_reference

from .conftest import REPO

DIGEST = "sha256:" + "ab" * 32
IMAGE = f"registry.example:5000/gpu/device-plugin@{DIGEST}"


@pytest.mark.parametrize(("reference", "host"), [
    ("registry.example:5000/gpu/device-plugin:0.1.0", "registry.example:5000"),
    ("localhost/plugin:1", "localhost"),
    (IMAGE, "registry.example:5000"),
])
def test_references_name_their_registry(reference: str, host: str) -> None:
    assert split_reference(reference)[0] == host


@pytest.mark.parametrize(("reference", "says"), [
    ("gpunode-device-plugin:0.1.0", "names no registry"),
    ("library/plugin:1", "names no registry"),
    ("registry.example/Plugin:1", "is not a repository"),
])
def test_a_reference_that_cannot_be_pushed_is_refused_with_the_form_to_use(reference: str, says: str) -> None:
    with pytest.raises(GpunodeError, match=says) as caught:
        split_reference(reference)
    assert "REGISTRY" in caught.value.fix or "lower-case" in caught.value.fix


def test_a_pinned_reference_is_the_repository_at_the_digest() -> None:
    assert pinned("registry.example:5000/gpu/device-plugin:0.1.0", DIGEST) == IMAGE
    assert pinned(IMAGE, DIGEST) == IMAGE


@pytest.fixture
def fake_skopeo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A skopeo on PATH that records its argv and the auth file it was given, and writes a digest file."""
    calls = tmp_path / "calls.json"
    script = tmp_path / "bin" / "skopeo"
    script.parent.mkdir()
    script.write_text(f"""#!{sys.executable}
import json, os, sys
args = sys.argv[1:]
auth = args[args.index("--dest-authfile") + 1] if "--dest-authfile" in args else None
record = {{"args": args, "auth": open(auth).read() if auth else None,
           "auth_mode": oct(os.stat(auth).st_mode & 0o777) if auth else None}}
open({str(calls)!r}, "w").write(json.dumps(record))
if "--digestfile" in args:
    open(args[args.index("--digestfile") + 1], "w").write({DIGEST!r})
if args[0] == "inspect":
    print({DIGEST!r})
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    return calls


def test_push_keeps_the_digest_and_keeps_the_password_off_the_command_line(fake_skopeo: Path, tmp_path: Path) -> None:
    archive = tmp_path / "image.tar"
    archive.write_bytes(b"oci")
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "ca.crt").write_text("CA")
    digest = push(archive, "registry.example:5000/gpu/device-plugin:0.1.0", Registry(certs, "ci", "s3cret"))
    assert digest == DIGEST
    call = json.loads(fake_skopeo.read_text())
    assert call["args"][:3] == ["copy", "--quiet", "--preserve-digests"]
    assert call["args"][-2:] == [f"oci-archive:{archive}", "docker://registry.example:5000/gpu/device-plugin:0.1.0"]
    assert ["--dest-cert-dir", str(certs)] == call["args"][3:5]
    assert not any("s3cret" in arg for arg in call["args"])
    token = json.loads(call["auth"])["auths"]["registry.example:5000"]["auth"]
    assert base64.b64decode(token) == b"ci:s3cret" and call["auth_mode"] == "0o600"


def test_push_without_skopeo_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    archive = tmp_path / "image.tar"
    archive.write_bytes(b"oci")
    with pytest.raises(GpunodeError, match="needs skopeo") as caught:
        push(archive, "registry.example/gpu/plugin:1", Registry())
    assert "apt-get install skopeo" in caught.value.fix


def test_the_cli_refuses_a_user_without_a_password(tmp_path: Path) -> None:
    archive = tmp_path / "image.tar"
    archive.write_bytes(b"oci")
    env = {k: v for k, v in os.environ.items() if k != "GPUNODE_REGISTRY_PASSWORD"}
    result = subprocess.run([sys.executable, "-m", "gpunode.cli", "image", "push", "registry.example/gpu/plugin:1",
                             "--archive", str(archive), "--username", "ci"], cwd=REPO, env=env,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 1 and "--username given without a password" in result.stderr
    assert "GPUNODE_REGISTRY_PASSWORD" in result.stderr


def test_registry_credentials_become_a_pull_secret_the_daemonset_names() -> None:
    settings = ManifestSettings.from_data({"plugin_image": IMAGE, "plugin_registry_username": "nodes",
                                           "plugin_registry_password": "pw"})
    docs = {d["kind"]: d for d in documents(render(settings))}
    secret = docs["Secret"]
    assert secret["metadata"]["name"] == PULL_SECRET and secret["type"] == "kubernetes.io/dockerconfigjson"
    config = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    assert base64.b64decode(config["auths"]["registry.example:5000"]["auth"]) == b"nodes:pw"
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": PULL_SECRET}] and pod["containers"][0]["image"] == IMAGE
    assert "pw" not in repr(settings)  # the settings may be logged; the credentials are not in them


def test_a_pull_secret_of_the_users_is_named_and_not_written() -> None:
    docs = documents(render(ManifestSettings.from_data({"plugin_image": IMAGE, "plugin_pull_secret": "regcred"})))
    assert "Secret" not in [d["kind"] for d in docs]
    assert docs[-1]["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert "imagePullSecrets" not in documents(render(ManifestSettings()))[-1]["spec"]["template"]["spec"]


@pytest.mark.parametrize(("data", "says"), [
    ({"plugin_registry_username": "u"}, "plugin_registry_password is not set but its partner is"),
    ({"plugin_registry_password": "p"}, "plugin_registry_username is not set but its partner is"),
    ({"plugin_registry_username": "u", "plugin_registry_password": "p", "plugin_pull_secret": "regcred"},
     "are both set"),
    ({"plugin_image": "gpunode-device-plugin:0.1.0", "plugin_registry_username": "u",
      "plugin_registry_password": "p"}, "names no registry"),
    ({"plugin_registry_username": "a:b", "plugin_registry_password": "p"}, "expected a user name without ':'"),
])
def test_registry_data_that_cannot_work_is_refused_before_anything_is_applied(data: dict, says: str) -> None:
    with pytest.raises(GpunodeError, match=says):
        ManifestSettings.from_data({"plugin_image": IMAGE, **data})


def test_the_rbac_rules_reach_only_the_pull_secret_by_name() -> None:
    rules = [r for r in rbac.namespace_rules() if r.resource == "secrets"]
    named = [r for r in rules if r.names]
    assert [(r.verbs, r.names) for r in named] == [(("get", "patch", "delete"), (PULL_SECRET,))]
    assert [r.verbs for r in rules if not r.names] == [("create",)]  # RBAC cannot limit create to a name


def test_a_tag_is_pinned_to_the_digest_its_registry_gives(fake_skopeo: Path) -> None:
    image, said = pin("registry.example:5000/gpu/device-plugin:0.1.0", Registry(None, "u", "p"))
    assert image == IMAGE and DIGEST in said
    call = json.loads(fake_skopeo.read_text())
    assert call["args"][:3] == ["inspect", "--format", "{{.Digest}}"] and "--authfile" in call["args"]


def test_what_cannot_be_pinned_stays_as_given_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert pin(IMAGE, Registry()) == (IMAGE, f"{IMAGE} is pinned by digest already")
    image, said = pin("gpunode-device-plugin:0.1.0", Registry())
    assert image == "gpunode-device-plugin:0.1.0" and "names no registry" in said
    monkeypatch.setenv("PATH", str(tmp_path))  # no skopeo
    image, said = pin("registry.example/gpu/plugin:1", Registry())
    assert image == "registry.example/gpu/plugin:1" and "needs skopeo" in said
