"""``gpunode check``: is this inventory ready for a deploy? Read-only, before anything is changed.

In order, each stage only when the one before it passed (a later check on a broken base proves nothing):

1. the inventory loads and its data is valid (``gpunode.inventory_data``: typos with a did-you-mean, refused
   values with what is allowed), before any connection;
2. per host, through the same connection as the deploy (``gpunode.connection``): SSH, sudo to root, the OS
   family gpunode provisions (apt or dnf), a container runtime, and the toolkit repository and its key
   reachable from the host (it downloads them there);
3. per cluster (the kubeconfig and context of the hosts' data): the kubeconfig, the API server, and every
   permission gpunode needs (``gpunode.cluster.rbac``), each asked with a SelfSubjectAccessReview.

Every line is ok with what proved it, a finding with the fix, or not checked with why (doctor's words).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from gpunode.cluster.client import ClusterSettings, api_call
from gpunode.cluster.rbac import Rule, cluster_rules, namespace_rules
from gpunode.connection import Connections, Reply, Unreachable
from gpunode.diagnosis import Verdict
from gpunode.errors import GpunodeError
from gpunode.host_settings import settings_of
from gpunode.image.push import Registry
from gpunode.inventory_data import check_data
from gpunode.settings import NodeSettings
from gpunode.verify.targets import Target, load_inventory

OK, FINDING, NOT_CHECKED = Verdict.OK, Verdict.FINDING, Verdict.NOT_CHECKED  # doctor's and verify's words
PROBE_MARK = "gpunode-check:"
PARALLEL = 20


@dataclass(frozen=True)
class Check:
    """One line of the preflight: what was checked, for whom, and what came of it."""

    subject: str  # "inventory", a host, or "cluster"
    name: str
    state: Verdict  # ok (with what was read), a finding (with the fix), not checked (with why)
    detail: str  # the proof for ok, the problem, or why not checked
    fix: str = ""


@dataclass
class Preflight:
    checks: list[Check] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        """Nothing found wrong. A link not checked (always said, with why) does not stop a deploy by itself:
        where it could not be checked because of a problem, that problem is on its own line."""
        return bool(self.checks) and not any(check.state == FINDING for check in self.checks)

    def add(self, subject: str, name: str, state: Verdict, detail: str, fix: str = "") -> None:
        self.checks.append(Check(subject, name, state, detail, fix))

    def as_json(self) -> dict:
        return {"ready": self.ready, "checks": [asdict(check) for check in self.checks]}


def probe_script(settings: NodeSettings) -> str:
    """One shell script (run with the host's sudo) that prints ``gpunode-check:KEY=VALUE`` lines."""
    urls = {"key": settings.toolkit_key_url, "deb": settings.toolkit_repository_url,
            "rpm": settings.toolkit_rpm_repository_url}
    lines = [
        f'm={PROBE_MARK}',
        'echo "${m}uid=$(id -u)"',
        '. /etc/os-release 2>/dev/null; echo "${m}os=${ID:-unknown} ${VERSION_ID:-}"; echo "${m}like=${ID_LIKE:-}"',
        'for c in apt-get dnf containerd dockerd curl; do echo "${m}$c=$(command -v $c)"; done',
        'arch=$(dpkg --print-architecture 2>/dev/null || uname -m); echo "${m}arch=$arch"',
        'fetch() { curl -fsS -o /dev/null --connect-timeout 10 --max-time 30 "$1" 2>&1 | head -n 1; }',
        f'echo "${{m}}key_url=$(fetch {shlex.quote(urls["key"])})"',
        'if command -v apt-get >/dev/null; then',
        f'  url=$(printf %s {shlex.quote(urls["deb"])} | sed "s/\\$(ARCH)/$arch/")/InRelease',
        'else',
        f'  url=$(printf %s {shlex.quote(urls["rpm"])} | sed "s/\\$basearch/$(uname -m)/")/repodata/repomd.xml',
        'fi',
        'echo "${m}index=$url"; echo "${m}index_url=$(fetch "$url")"',
    ]
    return "\n".join(lines) + "\n"


def parse_probe(stdout: str) -> dict[str, str]:
    found = {}
    for line in stdout.splitlines():
        if line.startswith(PROBE_MARK):
            key, _, value = line[len(PROBE_MARK):].partition("=")
            found[key] = value.strip()
    return found


def judge_host(report: Preflight, target: Target, reply: Reply | Unreachable) -> None:
    """The host's lines from its probe's reply."""
    name = target.name
    if isinstance(reply, Unreachable):
        check = "sudo" if reply.code == "sudo-refused" else "ssh"
        report.add(name, check, FINDING, reply.problem, reply.fix or "")
        return
    found = parse_probe(reply.stdout)
    if "uid" not in found:
        report.add(name, "ssh", FINDING, f"the probe printed nothing gpunode reads (stderr: {reply.stderr[:200]!r})",
                   "check that the host runs a POSIX shell for the SSH user")
        return
    report.add(name, "ssh", OK, f"connected as the inventory says and ran the probe on {name}")
    if found["uid"] != "0":
        report.add(name, "sudo", FINDING, f"commands run as uid {found['uid']}, not root: gpunode installs packages "
                   "and writes /etc", "set _sudo = True in the host's data (and _sudo_password if sudo asks one), "
                   "or connect as root")
        return
    report.add(name, "sudo", OK, "id -u printed 0 (root)")
    os_name, like = found.get("os", "unknown").strip(), found.get("like", "")
    if found.get("apt-get"):
        report.add(name, "os", OK, f"/etc/os-release: {os_name} (like {like or '-'}); apt-get at {found['apt-get']}")
    elif found.get("dnf"):
        report.add(name, "os", OK, f"/etc/os-release: {os_name} (like {like or '-'}); dnf at {found['dnf']}")
    else:
        report.add(name, "os", FINDING, f"/etc/os-release: {os_name}: neither apt-get nor dnf found",
                   "gpunode provisions the Debian and RHEL families (apt or dnf)")
    wanted = target.settings.container_runtime
    runtimes = {runtime: found.get(binary, "") for runtime, binary in (("containerd", "containerd"),
                                                                        ("docker", "dockerd"))}
    if wanted != "auto":
        if runtimes[wanted]:
            report.add(name, "container runtime", OK, f"container_runtime = {wanted}: {runtimes[wanted]}")
        else:
            report.add(name, "container runtime", FINDING, f"container_runtime = {wanted} but "
                       f"{'dockerd' if wanted == 'docker' else 'containerd'} is not installed on {name}",
                       "install it (the node's kubelet uses it), or set container_runtime to the one installed")
    elif runtimes["docker"] or runtimes["containerd"]:
        chosen = "docker" if runtimes["docker"] else "containerd"
        report.add(name, "container runtime", OK, f"container_runtime = auto: {chosen} ({runtimes[chosen]})")
    else:
        report.add(name, "container runtime", FINDING, f"neither containerd nor dockerd is installed on {name}",
                   "install the container runtime the node's kubelet uses first")
    if not found.get("curl"):
        report.add(name, "toolkit repository", FINDING, f"curl is not installed on {name}: the deploy downloads the "
                   "toolkit's key with it", "install curl (apt-get install curl / dnf install curl)")
        return
    settings = target.settings
    failures = [(url, found.get(key, "")) for url, key in ((settings.toolkit_key_url, "key_url"),
                                                          (found.get("index", ""), "index_url"))
                if found.get(key)]
    if failures:
        url, said = failures[0]
        report.add(name, "toolkit repository", FINDING, f"{name} cannot download {url}: {said}",
                   "let the host reach the repository (proxy, firewall), or point toolkit_repository_url, "
                   "toolkit_rpm_repository_url and toolkit_key_url at a mirror it reaches")
    else:
        report.add(name, "toolkit repository", OK, f"{name} downloaded {settings.toolkit_key_url} and "
                   f"{found.get('index', '')}")


def check_hosts(report: Preflight, targets: list[Target]) -> None:
    connections = Connections([(t.name, t.data) for t in targets])
    try:
        by_script: dict[str, list[Target]] = {}
        for target in targets:
            by_script.setdefault(probe_script(target.settings), []).append(target)
        replies: dict[str, Reply | Unreachable] = {}
        for script, group in by_script.items():
            if len(by_script) == 1:
                replies.update(connections.run_all(script, PARALLEL))
            else:
                replies.update((t.name, _one(connections, t.name, script)) for t in group)
        for target in targets:
            judge_host(report, target, replies[target.name])
    finally:
        connections.close()


def _one(connections: Connections, name: str, script: str) -> Reply | Unreachable:
    try:
        return connections.run(name, script)
    except Unreachable as error:
        return error


def wanted_rules(namespace: str) -> list[tuple[Rule, str, str | None]]:
    """(rule, verb, namespace) for every permission gpunode needs."""
    asks = [(rule, verb, None) for rule in cluster_rules(namespace) for verb in rule.verbs]
    asks += [(rule, verb, namespace) for rule in namespace_rules() for verb in rule.verbs]
    return asks


def check_cluster(report: Preflight, settings: ClusterSettings, namespace: str,
                  review: Callable[[Rule, str, str | None], bool] | None = None) -> None:
    """The kubeconfig, the API and every permission, for one cluster."""
    subject = f"cluster {settings.where}"
    if not settings.kubeconfig_path.is_file():
        report.add(subject, "kubeconfig", FINDING, f"no kubeconfig at {settings.kubeconfig_path}",
                   "set kubeconfig in the inventory data (or KUBECONFIG), or cluster_steps = False to provision "
                   "the nodes only")
        report.add(subject, "permissions", NOT_CHECKED, "no kubeconfig")
        return
    asks = wanted_rules(namespace)
    try:
        allowed = [(rule, verb, ns, (review or _review(settings))(rule, verb, ns)) for rule, verb, ns in asks]
    except GpunodeError as error:
        report.add(subject, "api", FINDING, error.problem, error.fix or "")
        report.add(subject, "permissions", NOT_CHECKED, "the API did not answer")
        return
    report.add(subject, "api", OK, f"the API server answered {len(asks)} SelfSubjectAccessReviews")
    denied = [(rule, verb, ns) for rule, verb, ns, ok in allowed if not ok]
    if denied:
        words = ", ".join(f"{verb} {rule.resource}" + (f" in {ns}" if ns else "") +
                          (f" ({', '.join(rule.names)})" if rule.names else "") for rule, verb, ns in denied)
        report.add(subject, "permissions", FINDING, f"{len(denied)} of {len(asks)} permissions denied: {words}",
                   "an admin applies 'gpunode render INVENTORY --rbac --subject KIND:NAME' for the identity of "
                   "this kubeconfig and context")
    else:
        report.add(subject, "permissions", OK, f"all {len(asks)} permissions gpunode needs are allowed "
                   "(SelfSubjectAccessReview)")


IMAGE_KEYS = {"plugin_image": ("plugin image", "gpunode image build"),
              "checker_image": ("node checker image", "gpunode image build --node-checker .")}


def check_plugin_image(report: Preflight, image: str, registry: Registry, key: str = "plugin_image") -> None:
    """An image the nodes pull (the plugin's, the node checker's) as its registry has it: a tag or digest that is
    there, read with the inventory's registry user; a registry this machine cannot read is not checked (the nodes
    may reach it where this machine cannot)."""
    from gpunode.image.push import refusal, resolve, split_reference

    subject, build = IMAGE_KEYS[key]
    try:
        split_reference(image)
    except GpunodeError:
        report.add(subject, image, FINDING, f"{key} {image} names no registry: the nodes would pull it from "
                   "Docker Hub, where gpunode's image is not published",
                   f"build and push it to your registry ({build}; gpunode image push REGISTRY/REPO:TAG) "
                   f"and set {key} to the reference the push prints")
        return
    try:
        digest = resolve(image, registry)
    except GpunodeError as error:
        # this machine's view, not the nodes': a registry it cannot reach or does not trust, or no skopeo here
        if refusal(error.problem) in ("reach", "trust") or "needs skopeo" in error.problem:
            report.add(subject, image, NOT_CHECKED, f"its registry cannot be read from this machine: {error.problem}")
        else:
            report.add(subject, image, FINDING, error.problem, error.fix or "")
        return
    report.add(subject, image, OK, f"the registry has it: {digest}")


def _review(settings: ClusterSettings) -> Callable[[Rule, str, str | None], bool]:
    from lightkube.models.authorization_v1 import ResourceAttributes, SelfSubjectAccessReviewSpec
    from lightkube.resources.authorization_v1 import SelfSubjectAccessReview

    def review(rule: Rule, verb: str, namespace: str | None) -> bool:
        resource, _, subresource = rule.resource.partition("/")
        attributes = ResourceAttributes(group=rule.group, resource=resource, subresource=subresource or None,
                                        verb=verb, namespace=namespace, name=rule.names[0] if rule.names else None)
        answer = api_call(settings, "ask the API what gpunode may do",
                          lambda client: client.create(SelfSubjectAccessReview(
                              spec=SelfSubjectAccessReviewSpec(resourceAttributes=attributes))))
        return bool(answer.status and answer.status.allowed)

    return review


def preflight(inventory: str, limit: list[str] | None = None, data: dict[str, str] | None = None) -> Preflight:
    report = Preflight()
    try:
        targets = load_inventory(inventory, limit, data)
    except GpunodeError as error:
        report.add("inventory", "loads", FINDING, error.problem, error.fix or "")
        return report
    report.add("inventory", "loads", OK, f"{inventory}: {len(targets)} host(s)")
    problems = check_data({t.name: t.data for t in targets})
    for problem in problems:
        report.add("inventory", f"data {problem.key}", FINDING,
                   f"{problem.what} ({'every host' if not problem.hosts else ', '.join(problem.hosts)})", problem.fix)
    if problems:
        report.add("hosts", "reachable", NOT_CHECKED, "the inventory data has problems: fix them first")
        return report
    report.add("inventory", "data", OK, "every key gpunode reads has a valid value; no key looks like a typo")
    check_hosts(report, targets)
    clusters: dict[tuple[str, str], tuple[ClusterSettings, str]] = {}
    images: dict[tuple[str, str], Registry] = {}
    for target in targets:
        parsed = settings_of(target)
        if parsed.cluster.cluster_steps:
            clusters.setdefault((str(parsed.cluster.kubeconfig_path), parsed.cluster.kube_context),
                                (parsed.cluster, parsed.manifests.namespace))
            images.setdefault(("plugin_image", parsed.manifests.image), parsed.registry)
            if parsed.manifests.checker_image:
                images.setdefault(("checker_image", parsed.manifests.checker_image), parsed.registry)
    for settings, namespace in clusters.values():
        check_cluster(report, settings, namespace)
    for (key, image), registry in images.items():
        check_plugin_image(report, image, registry, key)
    return report


def render(report: Preflight) -> str:
    lines = []
    for check in report.checks:
        mark = {OK: "ok", FINDING: "FINDING", NOT_CHECKED: "not checked"}[check.state]
        lines.append(f"{mark:<12} {check.subject}: {check.name}: {check.detail}")
        if check.fix:
            lines.append(f"{'':<12}   fix: {check.fix}")
    problems = sum(check.state == FINDING for check in report.checks)
    unchecked = sum(check.state == NOT_CHECKED for check in report.checks)
    lines.append(("ready for a deploy" if report.ready else f"not ready: {problems} finding(s)")
                 + (f"; {unchecked} not checked from here (above, with why)" if unchecked else ""))
    return "\n".join(lines) + "\n"
