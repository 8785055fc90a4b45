"""The rank side: everything that runs inside one rank (trainer and hooks, configs, the ppdet bridge, models, data, ops, distribution); it starts no process."""

from ppmulti.common.compat import quiet_paddle_import

# before any rank module imports paddle: its import-time ccache notice would fill every rank's log
quiet_paddle_import()
