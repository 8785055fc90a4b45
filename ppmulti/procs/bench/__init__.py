"""`ppmulti bench`: the scaling model (pure), the measuring run and its report; the probes themselves run as ranks (ppmulti.rank.bench_probe)."""
