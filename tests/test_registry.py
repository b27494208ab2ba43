"""The fleet's private registry as production has one: TLS from the fleet's CA, basic auth, the plugin pulled by
digest with the pull Secret the deploy writes; a wrong password and a missing tag named by the deploy and doctor in
the runtime's own words, and repaired by the deploy."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Pod, Secret

from .conftest import gpunode
from .test_provisioning import deploy, ssh
from .test_rollout import api
from .test_whole_chain import NAMESPACE, doctor, problem, wait_for

pytestmark = pytest.mark.fleet
NODE = "node01"  # containerd 1.6 and the real kubelet: the pull and its error are theirs


def inventory(fleet: dict) -> dict:
    return json.loads((Path(fleet["env"]["GPUNODE_SIM_DIR"]) / "inventory.json").read_text())


def plugin_image(fleet: dict) -> str:
    return inventory(fleet)["plugin"]["plugin_image"]


def forget_image(fleet: dict, node: str) -> None:
    """Remove the plugin image from the node's containerd and restart its plugin pod: the next one must pull."""
    ssh(fleet, node, f"sudo ctr -n k8s.io images rm {plugin_image(fleet)} >/dev/null")
    client = api(fleet)
    for pod in client.list(Pod, namespace=NAMESPACE, fields={"spec.nodeName": node}):
        client.delete(Pod, pod.metadata.name, namespace=NAMESPACE)


def test_the_plugin_is_pulled_by_digest_with_the_deploys_pull_secret(fleet: dict) -> None:
    client = api(fleet)
    image = plugin_image(fleet)
    assert image.startswith("registry.gpunode.test:5000/gpunode/device-plugin@sha256:")
    pod = client.get(DaemonSet, "gpunode-device-plugin", namespace=NAMESPACE).spec.template.spec
    assert pod.containers[0].image == image and [s.name for s in pod.imagePullSecrets] == ["gpunode-registry"]
    secret = client.get(Secret, "gpunode-registry", namespace=NAMESPACE)
    auths = json.loads(base64.b64decode(secret.data[".dockerconfigjson"]))["auths"]
    user = inventory(fleet)["plugin"]["plugin_registry_username"]
    assert secret.type == "kubernetes.io/dockerconfigjson"
    assert base64.b64decode(auths["registry.gpunode.test:5000"]["auth"]).decode().startswith(f"{user}:")
    # the nodes trust the registry the way an admin sets it up, and it wants credentials
    assert "ca = " in ssh(fleet, NODE, "cat /etc/containerd/certs.d/registry.gpunode.test:5000/hosts.toml")
    answer = ssh(fleet, NODE, "curl -s https://registry.gpunode.test:5000/v2/ "
                              "--cacert /etc/containerd/certs.d/registry.gpunode.test:5000/ca.crt")
    assert "UNAUTHORIZED" in answer, answer
    digests = ssh(fleet, "node02", "docker images --digests --format '{{.Repository}}@{{.Digest}}'").split()
    assert image in digests, digests  # the docker node's agent pulled it with the same Secret


def test_a_wrong_registry_password_is_named_and_the_deploy_repairs_it(fleet: dict, tmp_path: Path) -> None:
    wrong = ("--limit", NODE, "--data", "plugin_registry_password=not-the-password")
    try:
        result, _ = deploy(fleet, tmp_path, *wrong)
        assert result.returncode == 0, result.stdout[-2000:]  # the node still runs the image it has
        forget_image(fleet, NODE)

        def backing_off() -> bool:
            return any(p["subject"] == NODE and p["code"] == "plugin-image-pull" and "ImagePullBackOff" in
                       " ".join(p["evidence"]) for p in doctor(fleet)[1]["problems"])
        wait_for(backing_off, 90)
        found = problem(doctor(fleet)[1], NODE)
        assert "cannot pull the device plugin's image" in found["what"]
        assert "401 Unauthorized" in " ".join(found["evidence"]), found
        assert "plugin_registry_password" in found["fix"]
        # the deploy does not wait out its timeout for a pull the kubelet only backs off from
        result, _ = deploy(fleet, tmp_path, *wrong)
        output = result.stdout + result.stderr
        assert result.returncode == 1 and "401 Unauthorized" in output and "backs off pulling it" in output, \
            output[-3000:]
    finally:
        result, _ = deploy(fleet, tmp_path)  # the right password: the Secret is rewritten, the stuck pod replaced
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    wait_for(lambda: doctor(fleet)[0] == 0, 60)


def test_a_tag_missing_from_the_registry_is_named_by_the_rollout(fleet: dict, tmp_path: Path) -> None:
    missing = plugin_image(fleet).split("@")[0] + ":0.0.0-missing"
    try:
        result, _ = deploy(fleet, tmp_path, "--data", f"plugin_image={missing}")
        output = result.stdout + result.stderr
        assert result.returncode == 1, output[-3000:]
        assert f"cannot pull the device plugin's image {missing}" in output and "not found" in output, output[-3000:]
        assert "gpunode image push" in output
        found = [p for p in doctor(fleet)[1]["problems"] if p["code"] == "plugin-image-pull"]
        assert found and "not found" in " ".join(found[0]["evidence"]), found
    finally:
        result, _ = deploy(fleet, tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    wait_for(lambda: doctor(fleet)[0] == 0, 90)


def test_gpunode_image_push_puts_the_image_in_the_fleets_registry(fleet: dict, monkeypatch: pytest.MonkeyPatch) \
        -> None:
    from gpunode_sim.host.paths import SimPaths
    from gpunode_sim.images import plugin_image as builder
    from gpunode_sim.registry import server

    for name in ("GPUNODE_SIM_DIR", "GPUNODE_SIM_NET"):
        monkeypatch.setenv(name, fleet["env"][name])
    paths = SimPaths.from_env()
    reach = server.access(paths)
    digest = plugin_image(fleet).split("@")[1]  # the build the fleet runs (plugin/ may have changed since)
    folder = next(f for f in paths.cache.glob("plugin-image-*") if (f / "image.json").is_file()
                  and builder.describe(f)["digest"] == digest)
    archive = folder / builder.ARCHIVE
    reference = f"{reach.push_host}/gpunode/device-plugin:pushed-by-test"
    env = {**fleet["env"], "GPUNODE_REGISTRY_PASSWORD": reach.password}
    pushed = gpunode("image", "push", reference, "--archive", str(archive), "--cert-dir", str(reach.cert_dir),
                     "--username", reach.username, env=env, check=False)
    assert pushed.returncode == 0, pushed.stderr
    assert f"pushed {reference}: {digest}" in pushed.stdout  # the bytes as built: the registry serves that digest
    assert f'plugin_image = "{reach.push_host}/gpunode/device-plugin@{digest}"' in pushed.stdout
    env["GPUNODE_REGISTRY_PASSWORD"] = "wrong"
    refused = gpunode("image", "push", reference, "--archive", str(archive), "--cert-dir", str(reach.cert_dir),
                      "--username", reach.username, env=env, check=False)
    assert refused.returncode == 1 and "unauthorized" in refused.stderr.lower(), refused.stderr
    assert "refused the credentials" in refused.stderr


def test_render_pins_a_tag_to_the_digest_the_registry_gives(fleet: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpunode_sim.host.paths import SimPaths
    from gpunode_sim.registry import server

    from .test_provisioning import INVENTORY

    for name in ("GPUNODE_SIM_DIR", "GPUNODE_SIM_NET"):
        monkeypatch.setenv(name, fleet["env"][name])
    reach = server.access(SimPaths.from_env())
    digest = plugin_image(fleet).split("@")[1]
    # by the registry's address: this host cannot resolve the name the nodes use (their /etc/hosts is theirs)
    tagged = f"{reach.push_host}/gpunode/device-plugin:0.1.0"
    rendered = gpunode("render", INVENTORY, "--data", f"plugin_image={tagged}", "--data",
                       f"plugin_registry_cert_dir={reach.cert_dir}", env=fleet["env"], check=False)
    assert rendered.returncode == 0, rendered.stderr
    assert f"image: {reach.push_host}/gpunode/device-plugin@{digest}" in rendered.stdout
    assert f"{tagged} pinned to its digest in the registry: {digest}" in rendered.stderr
    kept = gpunode("render", INVENTORY, "--no-pin", "--data", f"plugin_image={tagged}", env=fleet["env"], check=False)
    assert f"image: {tagged}" in kept.stdout and "pinned" not in kept.stderr
    # a CA this host does not have: the tag stays, and stderr says why
    refused = gpunode("render", INVENTORY, "--data", f"plugin_image={tagged}", env=fleet["env"], check=False)
    assert refused.returncode == 0 and f"image: {tagged}" in refused.stdout
    assert "not pinned to a digest" in refused.stderr and "certificate" in refused.stderr, refused.stderr
