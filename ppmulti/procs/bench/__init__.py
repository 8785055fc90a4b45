"""`ppmulti bench`'s process side: the scaling model (pure), the measuring run and its report.

The probes it starts run as ranks: ppmulti.rank.bench_probe is the feature's rank side.
"""
