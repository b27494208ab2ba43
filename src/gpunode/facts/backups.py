"""Fact of ``gpunode undo``: every file gpunode backed up on the host, and whether it still differs.

gpunode keeps a copy of each file under ``/var/backups/gpunode/<stamp>/<path>`` (or an empty
``<path>.absent`` when the file did not exist) before it changes it (``gpunode.operations.backup``).
The copy from the earliest stamp is the file as it was before gpunode first touched it.
"""

from __future__ import annotations

from pyinfra.api import FactBase

BACKUP_ROOT = "/var/backups/gpunode"  # where every step keeps its copies (gpunode.operations.backup writes them)
ABSENT = ".absent"  # the marker of a file that did not exist before gpunode changed it


class Backups(FactBase):
    """Per backed-up path, its earliest copy and the file now.

    .. code:: python

        {"/etc/containerd/config.toml": {"stamp": "20261202T180000Z", "saved": "/var/backups/gpunode/2026.../"
                                         "etc/containerd/config.toml", "absent_before": False, "now": "differs"}}

    ``now`` is ``same`` (byte-identical to the copy), ``differs``, ``missing`` (the file is gone) or ``present``
    (it exists, and did not before gpunode).
    """

    def command(self) -> str:
        root = BACKUP_ROOT
        return (f"[ -d {root} ] || exit 0; find {root} -mindepth 2 -type f | LC_ALL=C sort | "
                f"while IFS= read -r saved; do rest=${{saved#{root}/}}; stamp=${{rest%%/*}}; path=/${{rest#*/}}; "
                f"case \"$path\" in *{ABSENT}) real=${{path%{ABSENT}}}; "
                "if [ -e \"$real\" ] || [ -L \"$real\" ]; then now=present; else now=same; fi;; "
                "*) real=$path; if [ ! -e \"$real\" ]; then now=missing; elif cmp -s \"$saved\" \"$real\"; then "
                "now=same; else now=differs; fi;; esac; "
                "printf '%s\\t%s\\t%s\\t%s\\n' \"$stamp\" \"$real\" \"$now\" \"$saved\"; done")

    def process(self, output: list[str]) -> dict[str, dict]:
        found: dict[str, dict] = {}
        for line in output:
            fields = line.split("\t")
            if len(fields) != 4:
                continue
            stamp, path, now, saved = fields
            earlier = found.get(path)
            if earlier is None or stamp < earlier["stamp"]:
                found[path] = {"stamp": stamp, "saved": saved, "absent_before": saved.endswith(ABSENT), "now": now}
        return found
