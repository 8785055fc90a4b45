"""The rank side: everything that runs inside one rank; it starts no process.

The trainer and its hooks, configs, the ppdet bridge, models, data, ops, distribution.
"""

from ppmulti.rank.compat import before_paddle_import

# before any rank module imports paddle: zlib first (see the function), and no ccache notice in every rank's log
before_paddle_import()
