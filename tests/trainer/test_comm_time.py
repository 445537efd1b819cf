"""Collective time per op (trainer/comm.py): two real gloo processes, one held back by a known
sleep, so the other's collectives are in flight at least that long. Lower bounds come from the
sleep, the upper bound from the wall interval the calls spanned (a union never exceeds it):
logical bounds, not timing assertions."""
import json
import subprocess
import sys
import textwrap

from tests.trainer.conftest import cpu_env, free_port

HOLD_S = 0.4

RANK = textwrap.dedent("""
    import json, sys, time
    import torch, torch.distributed as dist
    from shardbench.trainer.comm import COUNTER
    rank, port, hold = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    COUNTER.install()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    out = {}
    for case in ("sync", "async", "queued"):
        dist.barrier()
        COUNTER.reset()
        COUNTER.active = rank == 0
        if rank == 1:
            time.sleep(hold)  # rank 0's collectives wait for this one
        start = time.perf_counter()
        if case == "sync":
            dist.all_reduce(torch.ones(4))
        elif case == "async":
            dist.all_reduce(torch.ones(4), async_op=True).wait()
        else:  # three in flight at once, queued on gloo's thread like DDP's buckets
            for work in [dist.all_reduce(torch.ones(4), async_op=True) for _ in range(3)]:
                work.wait()
        wall = time.perf_counter() - start
        time.sleep(0.05)  # completion callbacks run on gloo's thread
        COUNTER.active = False
        out[case] = {"seconds": COUNTER.seconds.get("all_reduce", 0.0), "wall": wall,
                     "per_step": COUNTER.per_step(1)}
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(out))
""")


def test_collective_seconds_cover_the_wait_and_never_exceed_the_interval():
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(rank), port, str(HOLD_S)], env=cpu_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    cases = json.loads(outs[0][0])
    for case, got in cases.items():
        # Rank 0 waited for rank 1's sleep inside its collective: at least most of it counts.
        assert got["seconds"] >= 0.75 * HOLD_S, (case, got)
        # A union of in-flight time: never more than the interval the calls spanned. Summing the
        # three queued calls' call-to-completion times would give about three times the hold.
        assert got["seconds"] <= got["wall"] + 0.15, (case, got)
        calls = 3 if case == "queued" else 1
        assert got["per_step"]["all_reduce"] == {"calls": calls, "bytes": 16 * calls, "seconds": got["seconds"]}
