"""``relay chaos``: kill the stack's parts at random moments under load and prove nothing was lost.

Developer tooling (like ``relay_dev.bench``), never shipped in a job artifact. Modules:

- ``plan``: options and the seeded fault schedule (pure);
- ``procs``: finding and killing the stack's processes by PID from /proc;
- ``faults``: one injector per fault kind; it measures how supervision heals each kill;
- ``observe``: commits (read without taking the ledger's write lock), the load, the broker check;
- ``healer``: redeploys a pipeline that will not come back by itself (counted as a human action);
- ``report``: figures per kind and the printed table;
- ``parts``: the private, supervised stack, and waiting until a killed part is back;
- ``runner``: the run on a private stack, always stopped at the end.

Nothing is imported here: ``relay_dev.chaos.plan`` stays importable without the stack's modules.
"""
