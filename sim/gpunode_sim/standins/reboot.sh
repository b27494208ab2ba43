#!/bin/sh
# reboot in a simulated gpunode node: the node cannot restart itself from inside its namespaces, so it asks
# the fleet (the fleet's supervisor, gpunode_sim.host.supervisor, carries it out: processes stop, the disk stays, a new
# boot_id).
echo "reboot requested at $(date -u +%FT%TZ)" > /var/lib/gpunode-sim/reboot-requested
echo "System is going down for reboot NOW (gpunode simulated node)."
