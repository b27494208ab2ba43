"""What the simulator needs of and does on the host machine: paths, processes, prerequisites, the mirror, host
commands, the reboot supervisor."""
