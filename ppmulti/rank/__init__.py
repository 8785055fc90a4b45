"""The rank side: everything that runs inside one rank (trainer and hooks, configs, the ppdet bridge, models, data, ops, distribution); it starts no process."""

from ppmulti.rank.compat import before_paddle_import

# before any rank module imports paddle: zlib first (see the function), and no ccache notice in every rank's log
before_paddle_import()
