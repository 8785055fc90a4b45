"""The process side: everything that starts and watches processes (launch, nodes, detached runs, evolution, bench).

It imports no paddle, no ppdet and no ppmulti.rank module except the entry point ppmulti.rank.entry.
"""
