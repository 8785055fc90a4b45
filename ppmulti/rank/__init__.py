"""The rank side: everything that runs inside one rank (trainer and hooks, configs, the ppdet bridge, models, data, ops, distribution); it starts no process."""
