"""Backups of every file a step changes, and the way back from them.

Before a step changes a file it keeps a copy under ``/var/backups/gpunode/<stamp>/<path>`` (or an empty
``<path>.absent`` when the file did not exist), once per run and path; the copies are kept. The earliest copy
of a path is how the node was before gpunode first touched it: ``gpunode undo`` restores that one.
"""

from __future__ import annotations

from gpunode.facts.backups import BACKUP_ROOT


def backup_dir(stamp: str) -> str:
    return f"{BACKUP_ROOT}/{stamp}"


def backup_command(paths: list[str], stamp: str) -> str:
    """Shell that keeps a copy of each file (or notes that it was absent) once per run."""
    target = backup_dir(stamp)
    lines = [f"mkdir -p {target}"]
    for path in paths:
        saved, absent = f"{target}{path}", f"{target}{path}.absent"
        lines.append(f"if [ ! -e {saved} ] && [ ! -e {absent} ]; then mkdir -p $(dirname {saved});"
                     f" if [ -e {path} ]; then cp -a {path} {saved}; else : > {absent}; fi; fi")
    return "\n".join(lines)


def restore_command(stamp: str) -> str:
    """Shell that puts back every file backed up in this run (and removes those that were absent)."""
    target = backup_dir(stamp)
    return (f"find {target} -type f | while read -r saved; do path=${{saved#{target}}};"
            " case \"$path\" in *.absent) rm -f \"${path%.absent}\";; *) cp -a \"$saved\" \"$path\";; esac; done")
