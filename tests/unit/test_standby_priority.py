"""A standby's lower CPU priority: set on every thread of a real process tree, taken back, and never
lowered where it could not be taken back (relay.spark.standby_priority)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from relay.config import load_config
from relay.errors import ConfigError
from relay.spark import standby_priority as sp

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="Linux /proc")

# A parent with two threads that starts a child with a thread of its own: the shape of a JVM and
# its Python workers. Each prints its pid once its threads run, then waits for stdin to close.
TREE = textwrap.dedent(
    """
    import os, subprocess, sys, threading
    stop = threading.Event()
    threading.Thread(target=stop.wait, daemon=True).start()
    child = None
    if sys.argv[1] == "parent":
        child = subprocess.Popen(
            [sys.executable, __file__, "child"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        print(os.getpid(), child.stdout.readline().decode().strip(), flush=True)
    else:
        print(os.getpid(), flush=True)
    sys.stdin.read()
    if child:
        child.stdin.close()
        child.wait()
    """
)


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    proc = subprocess.Popen(
        [sys.executable, str(script), "parent"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        parent, child = (int(x) for x in proc.stdout.readline().split())  # type: ignore[union-attr]
        yield proc, parent, child
    finally:
        proc.stdin.close()  # type: ignore[union-attr]
        proc.wait(timeout=30)


def test_lower_sets_every_thread_of_the_tree_and_take_back_restores_them(tree) -> None:
    if not sp.can_take_back(0):
        pytest.skip("this user may not raise a priority back (root, CAP_SYS_NICE or RLIMIT_NICE)")
    _, parent, child = tree
    assert len(os.listdir(f"/proc/{parent}/task")) >= 2 and len(os.listdir(f"/proc/{child}/task")) >= 2
    assert sorted(sp.process_tree(parent)) == sorted([parent, child])

    assert sp.lower(parent, 10) == 0
    assert sp.thread_nice([parent]) == {10} and sp.thread_nice([child]) == {10}
    assert sp.lower(parent, 10) is None  # already that low: nothing to take back twice

    sp.take_back(parent, 0)
    assert sp.thread_nice([parent]) == {0} and sp.thread_nice([child]) == {0}


def test_a_standby_is_not_lowered_where_it_could_not_be_taken_back(tree, monkeypatch) -> None:
    _, parent, child = tree
    monkeypatch.setattr(sp.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(sp, "_has_cap_sys_nice", lambda: False)
    monkeypatch.setattr(sp.resource, "getrlimit", lambda _limit: (0, 0))
    assert sp.can_take_back(0) is False
    assert sp.lower(parent, 10) is None
    assert sp.thread_nice([parent]) == {0} and sp.thread_nice([child]) == {0}
    # a driver that stops (blue after the handoff) lowers itself anyway: it never takes it back
    assert sp.lower(parent, 10, returning=False) == 0
    assert sp.thread_nice([parent]) == {10} and sp.thread_nice([child]) == {10}


def test_switched_off_changes_nothing(tree) -> None:
    _, parent, child = tree
    assert sp.lower(parent, 0) is None
    assert sp.thread_nice([parent]) == {0} and sp.thread_nice([child]) == {0}


def test_jvm_above_finds_a_spark_jvm_at_most_two_levels_up(tmp_path: Path) -> None:
    """A fake JVM (argv[0] ending in ``java``, a Spark main class) above a chain of Python
    processes: found from its child and grandchild (a worker under its daemon), not from further."""
    chain = tmp_path / "chain.py"
    chain.write_text(
        textwrap.dedent(
            """
            import subprocess, sys
            sys.path.insert(0, sys.argv[-1])
            from relay.spark.standby_priority import jvm_above
            depth = int(sys.argv[-2])
            if depth == 0:
                print(jvm_above(), flush=True)
            else:
                subprocess.run([sys.executable, __file__, str(depth - 1), sys.argv[-1]], check=True)
            """
        )
    )
    include = str(Path(sp.__file__).resolve().parents[1])

    def found_from(depth: int) -> tuple[int, str]:
        # The fake JVM is Python run with argv[0] = .../java and a Spark class in its arguments.
        code = f"import subprocess,sys; subprocess.run([{sys.executable!r}, *sys.argv[2:]], check=True)"
        proc = subprocess.run(
            ["/opt/fake/bin/java", "-c", code, "org.apache.spark.executor.CoarseGrainedExecutorBackend",
             str(chain), str(depth), include],
            executable=sys.executable, capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        return proc.returncode, proc.stdout.strip()

    # depth d: the printing process is d+1 levels below the fake JVM
    _, from_child = found_from(0)
    _, from_grandchild = found_from(1)
    _, from_further = found_from(2)
    assert from_child.isdigit() and from_grandchild.isdigit()
    assert from_further == "None"


@pytest.mark.parametrize("raw", ["-1", "20", "ten"])
def test_standby_nice_is_validated(raw: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="RELAY_STANDBY_NICE"):
        load_config({"RELAY_STANDBY_NICE": raw, "RELAY_DATA_DIR": str(tmp_path)})
    with pytest.raises(ValueError, match="RELAY_STANDBY_NICE"):
        sp.standby_nice({"RELAY_STANDBY_NICE": raw})


def test_standby_nice_reaches_the_driver(tmp_path: Path) -> None:
    from relay.spark.driver_properties import driver_environment, driver_properties

    cfg = load_config({"RELAY_STANDBY_NICE": "15", "RELAY_DATA_DIR": str(tmp_path)})
    assert cfg.standby_nice == 15 and sp.standby_nice({}) == sp.DEFAULT_NICE == load_config({}).standby_nice
    assert sp.standby_nice(driver_environment(cfg)) == 15
    assert driver_properties(cfg, "app", False, [])["spark.driverEnv.RELAY_STANDBY_NICE"] == "15"
