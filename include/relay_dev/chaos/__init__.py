"""``relay chaos``: kill the stack's parts at random moments under load and prove nothing was lost.

Developer tooling (like ``relay_dev.bench``), never shipped in a job artifact. Modules:

- ``plan``: options and the seeded fault schedule (pure);
- ``procs``: finding and killing the stack's processes by PID from /proc;
- ``faults``: one injector per fault kind, and the restarts a platform would have done;
- ``observe``: commits (read without taking the ledger's write lock), the load, the broker check;
- ``healer``: redeploys a pipeline that will not come back by itself (counted as a human action);
- ``report``: figures per kind and the printed table;
- ``parts``: the private stack, one ``LocalStack`` per part so that parts restart independently;
- ``runner``: the run on a private stack, always stopped by PID at the end.

Nothing is imported here: ``relay_dev.chaos.plan`` stays importable without the stack's modules.
"""
