"""How an operator reaches the fleet: SSH identities and config, the bastion."""
