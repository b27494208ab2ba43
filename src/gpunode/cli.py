"""The ``gpunode`` command line."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import click

from gpunode import __version__
from gpunode.errors import GpunodeError

COMMANDS_GROUP = "gpunode.commands"  # entry points of other distributions that add a command group
# command groups gpunode's own extras provide: named (with what to install) even where they are not installed
EXTRAS = {"sim": "gpunode-sim"}


class PluggedGroup(click.Group):
    """gpunode's commands plus those other installed distributions add through the ``gpunode.commands``
    entry points (``gpunode sim`` comes from gpunode-sim); a command is imported only when it is used."""

    @staticmethod
    def plugged() -> dict[str, metadata.EntryPoint]:
        return {entry.name: entry for entry in metadata.entry_points(group=COMMANDS_GROUP)}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.plugged(), *EXTRAS})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        own = super().get_command(ctx, name)
        if own is not None:
            return own
        entry = self.plugged().get(name)
        if entry is not None:
            return entry.load()
        if name in EXTRAS:
            return self.unavailable(name, EXTRAS[name])
        return None

    @staticmethod
    def unavailable(name: str, missing: str) -> click.Command:
        """A stand-in command that help can list (with what it needs) and that says so when run."""
        fix = f"pip install 'gpunode[{name}]'"

        def refuse(**_: object) -> None:
            raise click.ClickException(f"gpunode {name} needs the {missing} package, which is not installed: {fix}")

        return click.Command(name, callback=refuse, short_help=f"(not installed: needs {missing}; {fix})",
                             help=f"Not available: needs the {missing} package. Install it with: {fix}",
                             context_settings={"ignore_unknown_options": True, "allow_extra_args": True})


@click.group(cls=PluggedGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpunode")
def cli() -> None:
    """Take NVIDIA GPU machines to Kubernetes nodes whose pods get working GPUs.

    \b
    Examples:
      gpunode sim up                 # three simulated GPU nodes on this machine
      gpunode sim ssh node01 nvidia-smi -L
      pyinfra inventories/sim.py exec -- nvidia-smi -L
      gpunode sim down
    """


@cli.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--limit", multiple=True, help="Only these hosts or groups (glob patterns work); repeatable.")
@click.option("--junit-xml", type=click.Path(dir_okay=False), help="Write JUnit XML (one test per host and step).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the results as JSON.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), help="Write a self-contained HTML page.")
@click.option("--data", multiple=True, metavar="KEY=VALUE", help="Override host data, as pyinfra's --data.")
@click.option("--in-cluster", is_flag=True, help="Read the node checker's results (Node conditions and its "
              "ConfigMaps) instead of reaching every host over SSH.")
def verify(inventory: str, limit: tuple[str, ...], junit_xml: str | None, json_path: str | None,
           html_path: str | None, data: tuple[str, ...], in_cluster: bool) -> None:
    """Prove every provisioning step on every host, changing nothing.

    Prints a host x step table (pass / FAIL with the reason / skip with why) and
    exits 0 only when nothing failed. Hosts are checked in parallel.

    \b
    Examples:
      gpunode verify inventories/prod.py
      gpunode verify inventories/sim.py --limit node01 --junit-xml verify.xml --html verify.html
    """
    from gpunode.verify import report
    from gpunode.verify.run import verify as run_verify

    code, results = run_verify(inventory, list(limit), junit_xml, json_path, html_path, list(data),
                               in_cluster=in_cluster)
    if results["hosts"]:
        click.echo(report.table(results))
    sys.exit(code)


@cli.command(name="node-check")
@click.option("--node", envvar="NODE_NAME", required=True, help="This node's Node name (env NODE_NAME, from the "
              "downward API's spec.nodeName).")
@click.option("--root", default="/", show_default=True, help="Where the host's root is: / on the host, /host in "
              "the node checker's pod (read through chroot).")
@click.option("--interval", default=60.0, show_default=True, type=click.FloatRange(min=1),
              help="Seconds between checks (SIGUSR1 checks at once).")
@click.option("--heartbeat", default=300.0, show_default=True, type=click.FloatRange(min=1),
              help="Seconds between writes of the conditions when none changed (node-problem-detector's heartbeat); "
              "a change is written at the check that sees it.")
@click.option("--once", is_flag=True, help="Check and publish once, then exit (1 if a link is broken).")
@click.option("--settings", "settings_file", type=click.Path(),
              help="YAML mapping of the host's inventory data (toolkit_version, container_runtime, ...), or a "
              "folder with one NODE.yaml per node (the DaemonSet's ConfigMap gpunode-node-settings); defaults "
              "where absent.")
@click.option("--data", multiple=True, metavar="KEY=VALUE", help="Override host data, as pyinfra's --data.")
@click.option("--inventory", type=click.Path(dir_okay=False), help="Read the node from outside as this inventory "
              "reaches it (--node names the inventory host), and publish with its kubeconfig: a node the "
              "DaemonSet does not run on yet.")
def node_check(node: str, root: str, interval: float, heartbeat: float, once: bool, settings_file: str | None,
               data: tuple[str, ...], inventory: str | None) -> None:
    """Judge this node's links and publish them as Node conditions (the node checker's DaemonSet runs it).

    One condition per link (GPUDriverReady, NvidiaToolkitRepositoryReady, NvidiaContainerToolkitReady,
    NvidiaRuntimeReady, GPUNodeLabelsReady, GPUDevicePluginReady), an Event when one changes, the whole verdict
    in ConfigMap gpunode-node-NODE;
    'gpunode verify --in-cluster' reads them. Reads the node, writes only its Node's status, its ConfigMap and
    Events.

    \b
    Examples:
      gpunode node-check --node node01 --once
      gpunode node-check --root /host --interval 60 --heartbeat 300   # in the DaemonSet's pod
    """
    from gpunode import node_checker
    from gpunode.diagnosis import Verdict
    from gpunode.verify.targets import Target, parse_data

    overrides = parse_data(list(data))
    if inventory:
        from gpunode.host_settings import settings_of
        from gpunode.verify.targets import load_inventory

        values, note = node_checker.node_settings(settings_file, node)
        if note:
            click.echo(note, err=True)
        target = load_inventory(inventory, [node], {**values, **overrides})[0]
        node = settings_of(target).cluster.k8s_node_name or target.name

        def target_of() -> Target:  # the inventory's host, as loaded
            return target
    else:
        said: set[str] = set()

        def target_of() -> Target:  # the settings as they are now: a deploy may have changed them
            values, note = node_checker.node_settings(settings_file, node)
            if note and note not in said:  # once, not every interval
                click.echo(note, err=True)
                said.add(note)
            return node_checker.local_target(node, root, {**values, **overrides})

    if not once:
        node_checker.run(target_of, node, interval, click.echo, max(heartbeat, interval))
        return
    target = target_of()
    state = node_checker.CheckerState()
    results, facts = node_checker.judge_own(target, node)
    # --once always writes: it is asked for when someone wants the node's word now
    for condition in node_checker.publish(target, node, results, facts, interval, state,
                                          heartbeat=max(heartbeat, interval), force=True) or []:
        click.echo(f"{condition['type']}={condition['status']} ({condition['reason']}): {condition['message']}")
    sys.exit(1 if any(r.state is Verdict.FINDING for r in results.values()) else 0)


@cli.command(name="init")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--sim", is_flag=True, help="Also write inventories/sim.py (the running simulated fleet).")
@click.option("--force", is_flag=True, help="Overwrite files that exist (they are kept by default).")
def init(directory: str, sim: bool, force: bool) -> None:
    """Write a pyinfra project of your own: inventory, group_data, deploys and a CI workflow.

    \b
    Examples:
      gpunode init gpu-fleet && cd gpu-fleet
      pyinfra inventories/prod.py deploys/bootstrap.py
      gpunode init gpu-fleet --sim    # plus inventories/sim.py for 'gpunode sim up'
    """
    from gpunode.init import init_project

    result = init_project(Path(directory), sim, force)
    for path in result.written:
        click.echo(f"wrote {Path(directory) / path}")
    for path in result.kept:
        click.echo(f"kept  {Path(directory) / path} (exists; --force overwrites it)")
    click.echo(f"next: put your hosts in {Path(directory) / 'inventories/prod.py'}, then, in {directory}:\n"
               "  pyinfra inventories/prod.py deploys/bootstrap.py\n"
               "  gpunode verify inventories/prod.py --junit-xml verify.xml")


DEFAULT_REPORT = "reports/gpunode-deploy-report.json"  # never the project's root; reports/ is for gitignore


@cli.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.argument("steps", nargs=-1)
@click.option("--limit", multiple=True, help="Only these hosts or groups (glob patterns work); repeatable.")
@click.option("--dry", is_flag=True, help="Show what would change; exit 2 if anything would (drift gate).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), default=DEFAULT_REPORT, show_default=True,
              help="Where to write the JSON report of what changed per host (its folder is made).")
@click.option("--data", multiple=True, metavar="KEY=VALUE", help="Override host data, as pyinfra's --data.")
def deploy(inventory: str, steps: tuple[str, ...], limit: tuple[str, ...], dry: bool, report_path: str,
           data: tuple[str, ...]) -> None:
    """Run the provisioning steps (all of them by default) with pyinfra, without prompts.

    STEPS: driver, toolkit_repo, toolkit, runtime, labels, device_plugin, or bootstrap (all; the default).
    The driver check always runs first. Exit codes: 0 ok (--dry: in sync), 1 a host failed (--dry: could not
    tell, e.g. SSH, the Kubernetes API or RBAC, with why), 2 drift found by --dry.

    \b
    Examples:
      gpunode deploy inventories/prod.py
      gpunode deploy inventories/prod.py toolkit runtime --limit gpu_nodes
      gpunode deploy inventories/prod.py --dry      # CI drift gate
    """
    from gpunode.deploy import run_deploy

    code, report = run_deploy(inventory, list(steps), list(limit), dry, report_path, list(data))
    verb = "would change" if dry else "changed"
    for host, result in report.items():
        state = "FAILED" if result["failed"] else (verb if result["changed"] else (
            f"not started ({result['skipped']})" if result.get("skipped") else "no change"))
        click.echo(f"{host:<20} {state}")
        for name in result["changed"]:
            click.echo(f"    {verb}: {name}")
        for name in result["failed"]:
            click.echo(f"    failed: {name}")
    click.echo(f"report: {report_path}")
    sys.exit(code)


@cli.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--limit", multiple=True, help="Only these hosts or groups (glob patterns work); repeatable.")
@click.option("--packages", is_flag=True, help="Also remove the four toolkit packages (apt purge / dnf remove).")
@click.option("--dry", is_flag=True, help="Show what would be undone; change nothing (exit 2 if anything would).")
@click.option("--report", "report_path", default="reports/gpunode-undo-report.json", show_default=True,
              help="Where to write the JSON report.")
@click.option("--data", multiple=True, metavar="KEY=VALUE", help="Override host data, as pyinfra's --data.")
def undo(inventory: str, limit: tuple[str, ...], packages: bool, dry: bool, report_path: str,
         data: tuple[str, ...]) -> None:
    """Undo what gpunode did: per host and on the cluster, from gpunode's own records. Idempotent.

    Deletes gpunode's cluster objects (the plugin's DaemonSet, ConfigMap, ServiceAccount, the nvidia
    RuntimeClass; not the namespace), removes only the node labels gpunode's field manager owns, releases the
    toolkit holds (and with --packages removes the packages), and puts back every file gpunode changed as its
    earliest backup in /var/backups/gpunode has it (removing the ones it added), restarting a runtime whose
    config came back. Exit codes as deploy: 0 done, 1 a host failed, 2 (--dry) something to undo.

    \b
    Examples:
      gpunode undo inventories/prod.py --limit gpu-a100-01 --dry
      gpunode undo inventories/prod.py --packages
    """
    from gpunode.deploy import run_deploy, undo_file

    code, report = run_deploy(inventory, [], list(limit), dry, report_path, list(data), deploy_text=undo_file(packages))
    verb = "would undo" if dry else "undid"
    for host, result in report.items():
        state = "FAILED" if result["failed"] else (verb if result["changed"] else "nothing to undo")
        click.echo(f"{host:<20} {state}")
        for name in result["changed"]:
            click.echo(f"    {verb}: {name}")
        for name in result["failed"]:
            click.echo(f"    failed: {name}")
    click.echo(f"report: {report_path}")
    sys.exit(code)


@cli.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--limit", multiple=True, help="Only these hosts or groups (glob patterns work); repeatable.")
@click.option("--data", multiple=True, metavar="KEY=VALUE", help="Override host data, as pyinfra's --data.")
@click.option("--dry", is_flag=True, help="Say what would be done per node; change nothing.")
def migrate(inventory: str, limit: tuple[str, ...], data: tuple[str, ...], dry: bool) -> None:
    """Move nodes from NVIDIA's device plugin to gpunode's, one node at a time, no running GPU pod disturbed.

    For each host in inventory order: NVIDIA's plugin leaves the node (the GPU Operator's own node switch, or
    a node affinity added once to NVIDIA's DaemonSet), the node gets gpunode.io/device-plugin=true and
    gpunode's plugin; then proven: NVIDIA's pod gone, gpunode's ready, allocatable nvidia.com/gpu as before,
    every running GPU pod the same pod with the same restarts. Stops at the first node that fails. Run
    'gpunode deploy' first (it leaves NVIDIA's nodes alone); RBAC: 'gpunode render INVENTORY --rbac
    --migrate-from NAMESPACE/NAME'. Back for one node: remove its label gpunode.io/device-plugin.

    \b
    Examples:
      gpunode migrate inventories/prod.py --limit gpu-a100-01 --dry
      gpunode migrate inventories/prod.py --limit a100_nodes
    """
    from gpunode.migrate import migrate as run_migrate
    from gpunode.verify.targets import parse_data

    code, moves = run_migrate(inventory, list(limit) or None, parse_data(list(data)), dry, click.echo)
    click.echo("")
    for moved in moves:
        click.echo(f"{moved.host:<20} {moved.node:<20} {moved.outcome}")
    sys.exit(code)


@cli.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--data", multiple=True, metavar="KEY=VALUE", help="Override host data, as pyinfra's --data.")
@click.option("--rbac", is_flag=True, help="Print instead the RBAC objects gpunode itself needs (least privilege).")
@click.option("--subject", default="User:gpunode", show_default=True, metavar="KIND:NAME",
              help="With --rbac: who gets the rules (User:NAME, Group:NAME, ServiceAccount:NS/NAME).")
@click.option("--migrate-from", multiple=True, metavar="NAMESPACE/NAME",
              help="With --rbac: also what 'gpunode migrate' needs on this DaemonSet of NVIDIA's; repeatable.")
@click.option("--no-pin", is_flag=True, help="Keep plugin_image as given (by default a tag is pinned to the digest "
              "it has in its registry, as the deploy does, when the registry answers).")
def render(inventory: str, data: tuple[str, ...], rbac: bool, subject: str, migrate_from: tuple[str, ...],
           no_pin: bool) -> None:
    """Print the Kubernetes manifests gpunode applies for INVENTORY (device-plugin DaemonSet and friends).

    Reads plugin_image, plugin_namespace, plugin_mig_strategy, plugin_device_list_strategy,
    nvidia_runtime_default and templates_dir from the inventory's data (group_data/all.py), and the DRA driver's
    objects where a host has gpu_allocation = dra. A plugin_image by
    tag is pinned to the digest the tag has in its registry (skopeo, with plugin_registry_cert_dir and the
    registry user), as the deploy pins it; where that cannot be read, the tag stays and stderr says why.

    With --rbac, the permissions gpunode's cluster steps, verify and doctor need and nothing more: the plugin's
    namespace, a ClusterRole and a Role in that namespace, bound to SUBJECT, then the rights of gpunode's own pods
    (the node checker, the DRA driver) for their ServiceAccounts. An admin applies them once; then
    point kubeconfig / kube_context at that identity.

    \b
    Examples:
      gpunode render inventories/prod.py | kubectl apply --dry-run=server -f -
      gpunode render inventories/prod.py --rbac --subject User:gpunode | kubectl apply -f -
    """
    from dataclasses import replace

    from gpunode.cluster.manifests import render as render_manifests
    from gpunode.cluster.rbac import render as render_rbac
    from gpunode.host_settings import settings_of, uses_dra
    from gpunode.verify.targets import load_inventory, parse_data

    targets = load_inventory(inventory, data=parse_data(list(data)))
    settings = replace(settings_of(targets[0]).manifests, dra_driver=uses_dra(targets))
    if not rbac and not no_pin:
        from gpunode.operations.device_plugin import pinned_manifests

        settings = pinned_manifests(settings, settings_of(targets[0]).registry,
                                    lambda line: click.echo(f"gpunode: {line}", err=True))
    click.echo(render_rbac(settings.namespace, subject, migrate_from) if rbac else render_manifests(settings),
               nl=False)


@cli.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--limit", multiple=True, help="Only these hosts or groups (glob patterns work); repeatable.")
@click.option("--data", multiple=True, metavar="KEY=VALUE", help="Override host data, as pyinfra's --data.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def check(inventory: str, limit: tuple[str, ...], data: tuple[str, ...], as_json: bool) -> None:
    """Preflight: is INVENTORY ready for a deploy? Reads only, changes nothing.

    The inventory's data first (typos, bad values), before any connection; then per host SSH, sudo, the OS
    family, the container runtime and the toolkit repository as the host reaches it; then the cluster: the
    kubeconfig, the API server and every permission gpunode needs; then plugin_image in its registry (skopeo;
    not checked where this machine cannot reach the registry). Exit 0 ready (no problem; a line not checked says
    why), 1 not ready.

    \b
    Examples:
      gpunode check inventories/prod.py
      gpunode check inventories/prod.py --limit h100_nodes --json
    """
    import json

    from gpunode.preflight import preflight
    from gpunode.preflight import render as render_preflight
    from gpunode.verify.targets import parse_data

    try:
        report = preflight(inventory, list(limit) or None, parse_data(list(data)))
    except GpunodeError as error:
        if not as_json:
            raise
        click.echo(json.dumps({"ready": False, "error": error.problem, "fix": error.fix}, indent=2))
        sys.exit(1)
    click.echo(json.dumps(report.as_json(), indent=2) if as_json else render_preflight(report), nl=False)
    sys.exit(0 if report.ready else 1)


@cli.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--node", help="Only this inventory host.")
@click.option("--pod", metavar="NS/NAME", help="Also explain this pod (Pending, not starting, no GPU), or the "
              "workload of that name (NS/KIND/NAME names one: why it has no pod).")
@click.option("--limit", multiple=True, help="Only these hosts or groups (glob patterns work); repeatable.")
@click.option("--data", multiple=True, metavar="KEY=VALUE", help="Override host data, as pyinfra's --data.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--in-cluster", is_flag=True, help="Read the node checker's results (Node conditions and its "
              "ConfigMaps) instead of reaching every host over SSH.")
def doctor(inventory: str, node: str | None, pod: str | None, limit: tuple[str, ...], data: tuple[str, ...],
           as_json: bool, in_cluster: bool) -> None:
    """Name the first broken link of the GPU chain on each node (and for a pod), with evidence and fix.

    Driver, toolkit repository, toolkit, runtime, node labels, device plugin, allocatable GPUs; device-plugin
    pods on CPU nodes and the nvidia RuntimeClass; with --pod, why that pod is Pending, cannot start or runs
    without a GPU. Changes nothing. Exit 0 when nothing is broken, 1 otherwise.

    \b
    Examples:
      gpunode doctor inventories/prod.py
      gpunode doctor inventories/prod.py --node gpu-a100-01.example.internal --pod ml/trainer-0 --json
    """
    import json

    from gpunode.doctor import examine
    from gpunode.doctor import render as render_report
    from gpunode.verify.targets import parse_data

    try:
        report = examine(inventory, list(limit), parse_data(list(data)), node, pod, in_cluster)
    except GpunodeError as error:
        if not as_json:
            raise
        click.echo(json.dumps({"error": error.problem, "fix": error.fix, "nodes": {}, "problems": [], "links": {}},
                              indent=2))
        sys.exit(1)
    click.echo(json.dumps(report.as_json(), indent=2) if as_json else render_report(report))
    sys.exit(1 if report.problems else 0)


@cli.command()
@click.argument("targets", nargs=-1, required=True)
@click.option("--nvidia-default", is_flag=True,
              help="nvidia is the cluster's default runtime (nvidia_runtime_default): runtimeClassName not needed.")
@click.option("--strict", is_flag=True, help="Warnings fail too (exit 1).")
@click.option("--format", "output_format", type=click.Choice(["text", "json", "github"]), default="text",
              show_default=True, help="github: workflow annotations on the files' lines.")
def lint(targets: tuple[str, ...], nvidia_default: bool, strict: bool, output_format: str) -> None:
    """Check GPU resource specs in workload manifests (FILE, DIR or - for stdin) before they reach the cluster.

    Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet, Job and CronJob (and List) documents, init
    containers included, as the API server validates them (quantities compared as quantities: 1.0 and 1000m
    are 1): GPU requests without limits, requests unequal to limits, fractional or negative counts; GPU pods
    without runtimeClassName: nvidia; and, as warnings, NVIDIA resource names no plugin offers (a typo such as
    nvidia.com/gpus leaves a pod Pending for ever). DRA across the files of one run: claims a pod or container
    names, request counts (errors in the API server's words), templates, claims and DeviceClasses not defined,
    selectors that read what gpunode's DRA driver does not publish (warnings). Prints file:line, the API
    server's message and the corrected snippet. A file that does not parse is named and the others are still
    linted. For Helm charts, lint what they render: helm template CHART | gpunode lint -.
    Exit 0: no errors (warnings too with --strict), 1: findings, 2: a file could not be read or parsed.

    \b
    Examples:
      gpunode lint k8s/
      helm template charts/trainer | gpunode lint - --format github
    """
    import json

    from gpunode.lint import lint_targets

    findings, unreadable = lint_targets(list(targets), nvidia_default)
    errors = [f for f in findings if f.level == "error"]
    warnings = [f for f in findings if f.level != "error"]
    if output_format == "json":
        click.echo(json.dumps({"findings": [f.as_json() for f in findings], "unreadable": unreadable}, indent=2))
    else:
        for finding in findings:
            click.echo(finding.github() if output_format == "github" else str(finding))
        if output_format == "text":
            click.echo(f"{len(errors)} finding(s)" + (f", {len(warnings)} warning(s)" if warnings else "")
                       if findings else "no GPU spec problems found")
    for problem in unreadable:
        click.echo(f"gpunode lint: {problem}", err=True)
    if unreadable:
        sys.exit(2)
    sys.exit(1 if errors or (strict and warnings) else 0)


@cli.group()
def image() -> None:
    """The device plugin's container image in your registry."""


@image.command(name="build")
@click.option("--plugin", "source", default="plugin", show_default=True, type=click.Path(),
              help="The device plugin's source folder (plugin/ of a gpunode checkout) or its wheel.")
@click.option("--node-checker", "checker", default=None, type=click.Path(exists=True),
              help="Build the node checker's image instead, from gpunode's checkout (its root) or gpunode's wheel.")
@click.option("--out", default=None, type=click.Path(file_okay=False),
              help="Folder for image.tar (an OCI archive, also a docker load archive) and image.json "
                   "[default: gpunode-device-plugin-image, or gpunode-node-checker-image].")
@click.option("--cache", default=None, type=click.Path(file_okay=False),
              help="Where the base layer is kept between builds (default: $XDG_CACHE_HOME/gpunode, else "
                   "~/.cache/gpunode).")
@click.option("--constraint", "constraint_files", multiple=True, type=click.Path(dir_okay=False, exists=True),
              help="pip constraints for the plugin's dependencies (e.g. pip freeze of a tested environment); "
                   "repeatable. The same inputs give the same image digest.")
def image_build(source: str, checker: str | None, out: str | None, cache: str | None,
                constraint_files: tuple[str, ...]) -> None:
    """Build the device plugin's image (or the node checker's: --node-checker) without a Docker engine: Debian 12
    slim with Debian's Python (debootstrap, as root, once per cache folder) and the package with its dependencies
    from wheels; print the archive and its digest. plugin/Dockerfile describes the plugin's for Docker users.

    \b
    Example:
      gpunode image build --plugin plugin/ && gpunode image push REGISTRY/gpu/device-plugin:0.1.0 \\
          --archive gpunode-device-plugin-image/image.tar
    """
    import os

    from gpunode.image.build import ARCHIVE, CHECKER, PLUGIN, build

    recipe = CHECKER if checker else PLUGIN
    source = checker or source
    out = out or f"{recipe.name}-image"
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpunode"
    constraints = [line.strip() for name in constraint_files for line in Path(name).read_text().splitlines()
                   if line.strip() and not line.lstrip().startswith("#")]
    described = build(Path(source).resolve(), Path(out).resolve(), Path(cache) if cache else home,
                      lambda line: click.echo(f"  {line}", err=True), constraints=constraints, recipe=recipe)
    click.echo(f"{Path(out).resolve() / ARCHIVE}  {described['name']}  {described['digest']}  "
               f"{described['archive_bytes'] / 2**20:.0f} MiB")


@image.command(name="push")
@click.argument("reference")
@click.option("--archive", required=True, type=click.Path(dir_okay=False, exists=True),
              help="The image as an OCI archive (what 'gpunode sim build' writes; skopeo copy ... oci-archive:FILE "
                   "makes one of any image).")
@click.option("--cert-dir", type=click.Path(file_okay=False, exists=True),
              help="A folder with the registry's CA as ca.crt (default: the system's trust and "
                   "/etc/containers/certs.d/HOST:PORT/).")
@click.option("--username", help="Registry user; the password is read from GPUNODE_REGISTRY_PASSWORD. Default: the "
              "credentials of 'docker login' / 'skopeo login'.")
def image_push(reference: str, archive: str, cert_dir: str | None, username: str | None) -> None:
    """Push the plugin image to REFERENCE (REGISTRY[:PORT]/REPOSITORY:TAG), bytes unchanged, through skopeo;
    print its digest and the reference to put in plugin_image (pinned by digest).

    \b
    Example:
      GPUNODE_REGISTRY_PASSWORD=... gpunode image push registry.example:5000/gpu/device-plugin:0.1.0 \\
          --archive image.tar --username ci
    """
    import os

    from gpunode.image.push import Registry, pinned, push

    password = os.environ.get("GPUNODE_REGISTRY_PASSWORD")
    if username and password is None:
        raise GpunodeError("--username given without a password",
                           "set GPUNODE_REGISTRY_PASSWORD (kept off the command line and out of shell history)")
    registry = Registry(Path(cert_dir) if cert_dir else None, username, password)
    digest = push(Path(archive), reference, registry)
    click.echo(f"pushed {reference}: {digest}")
    click.echo(f"plugin_image = \"{pinned(reference, digest)}\"")


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except GpunodeError as error:
        click.echo(f"gpunode: {error}", err=True)
        sys.exit(1)
    except click.exceptions.Abort:
        click.echo("gpunode: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as error:
        error.show()
        sys.exit(error.exit_code)
    except click.exceptions.Exit as exit_:
        sys.exit(exit_.exit_code)


if __name__ == "__main__":
    main()
