"""One trainer rank of tests/deploy/slurm_job_test.sh, run by deploy/slurm/paramd_job.sbatch in
place of the example trainer. It takes what the script hands every rank and checks it the way a
trainer uses it:

- PARAMD_DAEMONS lists every node's daemon once, sorted as Register wants (byte order: Python
  compares these ASCII strings as std::string does), starts with PARAMD_ADDRESS and names this
  rank's PARAMD_LOCAL_ADDRESS;
- the daemon at PARAMD_LOCAL_ADDRESS advertises itself as that address;
- the daemons take the job's token (PARAMD_TOKEN_FILE) and refuse a call without one;
- it accepts a job registered with the list as is (register(daemons=PARAMD_DAEMONS.split(",")),
  which registers with every daemon of the list) and shows the list back, and it refuses a list
  of one other daemon (FAILED_PRECONDITION), so the acceptance means that the list names it.

Prints one line per rank, and writes the same line to RESULTS_DIR/rank.RANK when the test sets
PARAMD_CHECK_RESULTS_DIR (the ranks' output shares one file with 5 other processes, whose lines a
busy machine may interleave); any failed check is an exception and a non-zero exit.
"""

import os

import paramd


def main():
    daemons = os.environ["PARAMD_DAEMONS"].split(",")
    local = os.environ["PARAMD_LOCAL_ADDRESS"]
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    nodes = int(os.environ["SLURM_JOB_NUM_NODES"])
    assert len(daemons) == nodes, f"PARAMD_DAEMONS lists {len(daemons)} daemons, not {nodes}"
    assert len(set(daemons)) == nodes, f"PARAMD_DAEMONS repeats an address: {daemons}"
    assert daemons == sorted(daemons), f"PARAMD_DAEMONS is not sorted: {daemons}"
    assert local in daemons, f"PARAMD_LOCAL_ADDRESS {local} is not in {daemons}"
    assert os.environ["PARAMD_ADDRESS"] == daemons[0], "PARAMD_ADDRESS is not the list's first"
    assert int(os.environ["LOCAL_RANK"]) == int(os.environ["SLURM_LOCALID"])

    client = paramd.connect(local, transport="inline")
    advertised = client.status("", daemon_only=True)["advertise_address"]
    assert advertised == local, f"the daemon at {local} advertises itself as {advertised}"
    tensors = [("w", 4, 8, "fp32")]
    client.register(job="deploy", rank=rank, world_size=world_size, tensors=tensors,
                    hyperparams=paramd.hyperparams(), daemons=daemons)
    listed = client.status("deploy")["jobs"][0]["daemons"]
    assert listed == daemons, f"the daemon shows the job's list as {listed}, not {daemons}"
    other = next(d for d in daemons if d != local)
    try:
        client.register(job=f"without-{rank}", rank=0, world_size=1, tensors=tensors,
                        hyperparams=paramd.hyperparams(), daemons=[other])
        raise AssertionError(f"{local} accepted a daemon list without it: [{other}]")
    except paramd.StatusError as e:
        assert e.code == "FAILED_PRECONDITION", e
    client.close()
    # The daemons take calls with the job's token alone (PARAMD_TOKEN_FILE, which connect reads).
    assert os.environ.get("PARAMD_TOKEN_FILE"), "no PARAMD_TOKEN_FILE"
    stranger = paramd.connect(local, transport="inline", token_file="", max_attempts=1)
    try:
        stranger.register(job=f"stranger-{rank}", rank=0, world_size=1, tensors=tensors,
                          hyperparams=paramd.hyperparams())
        raise AssertionError(f"{local} took a register without a token")
    except paramd.StatusError as e:
        assert e.code == "UNAUTHENTICATED", e
    stranger.close()
    line = f"rank {rank}: the daemon at {local} accepted job deploy with daemons {','.join(daemons)}"
    results = os.environ.get("PARAMD_CHECK_RESULTS_DIR")
    if results:
        with open(os.path.join(results, f"rank.{rank}"), "w") as f:
            f.write(line + "\n")
    print(line, flush=True)


if __name__ == "__main__":
    main()
